// The environment the launcher's tests hand to what reads one (the command
// line, Slurm's variables, accelerate's config), and its edits.
#ifndef MUSTER_TESTS_LAUNCHER_ENV_H_
#define MUSTER_TESTS_LAUNCHER_ENV_H_

#include <map>
#include <string>

namespace muster {

using Env = std::map<std::string, std::string>;

inline Env With(Env env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}

inline Env Without(Env env, const std::string& name) {
  env.erase(name);
  return env;
}

}  // namespace muster

#endif  // MUSTER_TESTS_LAUNCHER_ENV_H_
