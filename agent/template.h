// Python's string.Template.safe_substitute, which torchrun applies to each
// worker's arguments (${local_rank}) and to --log-line-prefix-template. Pure.
#ifndef MUSTER_AGENT_TEMPLATE_H_
#define MUSTER_AGENT_TEMPLATE_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"

namespace muster {

// `text` with `$name` and `${name}` replaced by vars[name] for each name in
// `vars`, and `$$` by `$`. A name is a letter or underscore, then letters,
// digits and underscores (ASCII, any case; the longest such run after a bare
// `$`). Anything else is left as it is, as safe_substitute leaves it: an
// unknown name, a `$` before no name, an unclosed `${`.
std::string SubstituteTemplate(absl::string_view text,
                               const std::map<std::string, std::string, std::less<>>& vars);

}  // namespace muster

#endif  // MUSTER_AGENT_TEMPLATE_H_
