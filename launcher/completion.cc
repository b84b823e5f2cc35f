#include "launcher/completion.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace muster {
namespace {

bool IsChoice(absl::string_view word) {
  if (word.empty() || word[0] < 'a' || word[0] > 'z') return false;
  for (char c : word) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

bool TakesDirectory(const OptionSummary& option) { return option.value_name == "DIR"; }

// Every spelling of the options that take a value, as a case pattern: --a|--a_b|-r.
std::string ValueOptionsPattern(const std::vector<OptionSummary>& options) {
  std::vector<std::string> spellings;
  for (const OptionSummary& option : options) {
    if (option.value_name.empty()) continue;
    spellings.insert(spellings.end(), option.spellings.begin(), option.spellings.end());
  }
  return absl::StrJoin(spellings, "|");
}

std::string AllSpellings(const std::vector<OptionSummary>& options) {
  std::vector<std::string> spellings;
  for (const OptionSummary& option : options) {
    spellings.insert(spellings.end(), option.spellings.begin(), option.spellings.end());
  }
  return absl::StrJoin(spellings, " ");
}

// The bash function and its registration; zsh runs it through bashcompinit.
std::string BashFunction(const std::vector<OptionSummary>& options) {
  const std::string value_options = ValueOptionsPattern(options);
  std::string value_cases;
  for (const OptionSummary& option : options) {
    if (option.value_name.empty()) continue;
    const std::string pattern = absl::StrJoin(option.spellings, "|");
    if (TakesDirectory(option)) {
      absl::StrAppend(&value_cases, "    ", pattern, ") _muster_reply -d -- \"$cur\"; return ;;\n");
    } else if (std::vector<std::string> choices = CompletionChoices(option.value_name);
               !choices.empty()) {
      absl::StrAppend(&value_cases, "    ", pattern, ") _muster_reply -W \"",
                      absl::StrJoin(choices, " "), "\" -- \"$cur\"; return ;;\n");
    }
  }
  return absl::StrCat(
      "# COMPREPLY from compgen's lines: no word splitting, no globbing.\n"
      "_muster_reply() {\n"
      "  local line\n"
      "  COMPREPLY=()\n"
      "  while IFS= read -r line; do COMPREPLY+=(\"$line\"); done < <(compgen \"$@\")\n"
      "}\n"
      "_muster() {\n"
      "  # bash splits words at ':' and '=' (COMP_WORDBREAKS): glue them back\n"
      "  # (--nnodes 1:2 is two words, --rdzv-conf k=v two, --opt=v one).\n"
      "  local words=() cword=0 j w n\n"
      "  for ((j = 0; j < ${#COMP_WORDS[@]}; j++)); do\n"
      "    w=${COMP_WORDS[j]}\n"
      "    n=${#words[@]}\n"
      "    if ((n > 0)) && [[ $w == [:=] || ${COMP_WORDS[j-1]} == [:=] ]]; then\n"
      "      words[n-1]+=$w\n"
      "    else\n"
      "      words+=(\"$w\")\n"
      "    fi\n"
      "    ((j == COMP_CWORD)) && cword=$((${#words[@]} - 1))\n"
      "  done\n"
      "  # What readline replaces: the text after the last ':' or '='.\n"
      "  local cur=${COMP_WORDS[COMP_CWORD]} prev= i\n"
      "  [[ $cur == [:=] ]] && cur=\n"
      "  if [[ ${words[cword]} == -*=* ]]; then\n"
      "    prev=${words[cword]%%=*}\n"
      "  elif ((cword > 0)); then\n"
      "    prev=${words[cword-1]}\n"
      "  fi\n"
      "  # Options end at the script; the words after it are the script's: files.\n"
      "  for ((i = 1; i < cword; i++)); do\n"
      "    case ${words[i]} in\n"
      "    -*=*) ;;\n"
      "    ",
      value_options,
      ") ((i++)) ;;\n"
      "    --) _muster_reply -f -- \"$cur\"; return ;;\n"
      "    -*) ;;\n"
      "    *) _muster_reply -f -- \"$cur\"; return ;;\n"
      "    esac\n"
      "  done\n"
      "  case $prev in\n",
      value_cases, "    ", value_options,
      ") return ;;  # a value to type\n"
      "  esac\n"
      "  if [[ $cur == -* ]]; then\n"
      "    _muster_reply -W \"",
      AllSpellings(options),
      "\" -- \"$cur\"\n"
      "  else\n"
      "    _muster_reply -f -- \"$cur\"\n"
      "  fi\n"
      "}\n"
      "complete -o filenames -F _muster muster\n");
}

std::string TcshScript(const std::vector<OptionSummary>& options) {
  std::string rules;
  std::vector<std::string> long_names;
  std::vector<std::string> short_names;
  for (const OptionSummary& option : options) {
    for (const std::string& spelling : option.spellings) {
      if (absl::StartsWith(spelling, "--")) {
        long_names.push_back(spelling.substr(2));
      } else {
        short_names.push_back(spelling.substr(1));
      }
      if (option.value_name.empty()) continue;
      if (TakesDirectory(option)) {
        absl::StrAppend(&rules, " 'n/", spelling, "/d/'");
      } else if (std::vector<std::string> choices = CompletionChoices(option.value_name);
                 !choices.empty()) {
        absl::StrAppend(&rules, " 'n/", spelling, "/(", absl::StrJoin(choices, " "), ")/'");
      } else {
        absl::StrAppend(&rules, " 'n/", spelling, "/x:<", option.value_name, ">/'");
      }
    }
  }
  // One line, no comment: tcsh's eval "`...`" joins the lines, and a comment
  // would swallow the rest.
  return absl::StrCat("complete muster", rules, " 'c/--/(", absl::StrJoin(long_names, " "),
                      ")/' 'c/-/(", absl::StrJoin(short_names, " "), " -)/' 'p/*/f/'\n");
}

}  // namespace

std::vector<std::string> CompletionChoices(const std::string& value_name) {
  std::vector<std::string> out;
  if (!absl::StrContains(value_name, '|')) return out;
  for (absl::string_view word : absl::StrSplit(value_name, '|')) {
    if (IsChoice(word)) out.emplace_back(word);
  }
  return out;
}

std::string CompletionScript(const std::string& shell, const std::vector<OptionSummary>& options) {
  if (shell == "bash") {
    return absl::StrCat(
        "# muster's completion for bash (muster --print-completion bash); load it with\n"
        "#   source <(muster --print-completion bash)\n"
        "# or save it as /usr/share/bash-completion/completions/muster.\n",
        BashFunction(options));
  }
  if (shell == "zsh") {
    return absl::StrCat(
        "# muster's completion for zsh (muster --print-completion zsh), bash's through\n"
        "# zsh's bashcompinit; load it with\n"
        "#   source <(muster --print-completion zsh)\n"
        "(( ${+functions[compdef]} )) || { autoload -U +X compinit && compinit; }\n"
        "autoload -U +X bashcompinit && bashcompinit\n",
        BashFunction(options));
  }
  if (shell == "tcsh") return TcshScript(options);
  return "";
}

}  // namespace muster
