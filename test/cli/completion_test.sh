#!/usr/bin/env bash
# The bash completion (scripts/bnfold-completion.bash) offers each command's options as its --help lists them, and
# rule names after --rules: a new option or rule completes without editing the script.
#   test/cli/completion_test.sh BNFOLD COMPLETION_SCRIPT
set -euo pipefail
bnfold="$1"
source "$2"
# Outside a real completion compopt refuses to run; what it sets (no space, file names) is not what is tested.
compopt() { :; }

expect() {  # WANTED WORD... : completing the last word of the command line offers WANTED
  local wanted="$1"
  shift
  COMP_WORDS=("$@")
  COMP_CWORD=$(($# - 1))
  COMPREPLY=()
  _bnfold || :  # compgen fails when nothing matches: then COMPREPLY is empty, reported below
  if ! printf '%s\n' "${COMPREPLY[@]}" | grep -qxF -- "$wanted"; then
    echo "completing '$*' does not offer $wanted (offers: ${COMPREPLY[*]})"
    exit 1
  fi
}

expect --equalize "$bnfold" fold --equ
expect --absorb-high-bias "$bnfold" fold model.onnx --abs
expect --target-opset "$bnfold" check --target
expect --timings "$bnfold" fold --tim
expect --weights "$bnfold" info --wei
expect --output "$bnfold" fold --outp
expect --fail-on "$bnfold" check --fail
expect +norm-decompose "$bnfold" fold --rules +norm-d
expect fold "$bnfold" fo
echo "completion: every expected word offered"
