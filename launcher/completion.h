// `muster --print-completion SHELL`: a completion script for bash, zsh or
// tcsh, made from the options' table, as torchrun's is made from its parser.
// Options and their spellings complete, choices complete after their option
// (--rdzv-backend c<TAB>), --log-dir takes a directory, and from the
// script on every word is a file name. Pure.
#ifndef MUSTER_LAUNCHER_COMPLETION_H_
#define MUSTER_LAUNCHER_COMPLETION_H_

#include <string>
#include <vector>

#include "launcher/options.h"

namespace muster {

// The values an option's help name lists as its choices: the lowercase
// words of "N|gpu|cpu|auto" (gpu, cpu, auto); none for "RANK" or "0-3|RANK:V,...".
std::vector<std::string> CompletionChoices(const std::string& value_name);

// The script for `shell` ("bash", "zsh" or "tcsh"; anything else gives "").
std::string CompletionScript(const std::string& shell, const std::vector<OptionSummary>& options);

}  // namespace muster

#endif  // MUSTER_LAUNCHER_COMPLETION_H_
