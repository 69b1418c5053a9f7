# bash completion for bnfold.
#   source scripts/bnfold-completion.bash                      # this shell
#   cp scripts/bnfold-completion.bash /usr/share/bash-completion/completions/bnfold   # every shell
# Rule names and each command's options are read from `bnfold ... --help`, so new ones complete without editing this
# file.

_bnfold_rules() {
  "${1:-bnfold}" fold --help 2>/dev/null | sed -n 's/^  [* ] \([a-z0-9][a-z0-9-]*\)  .*/\1/p'
}

# The options of a command as its --help lists them ("  -o,--output TEXT  ..." gives -o and --output).
_bnfold_options() {
  "${1:-bnfold}" "$2" --help 2>/dev/null | sed -n 's/^  \(-[^ ]*\).*/\1/p' | tr ',' '\n'
}

_bnfold() {
  local cur prev words cword
  if declare -F _init_completion >/dev/null; then
    _init_completion || return
  else
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  fi

  local global_opts="-h --help --help-all --version -v --verbose -q --quiet"
  local command="" i
  for ((i = 1; i < cword; i++)); do
    case "${words[i]}" in
      info|fold|check) command="${words[i]}"; break ;;
    esac
  done

  # Values of options that take one.
  case "$prev" in
    --format) COMPREPLY=($(compgen -W "text json ndjson github" -- "$cur")); return ;;
    --fail-on)
      local categories="foldable-bn training-bn unfoldable-bn kept-bn bias-add scale-fold decomposable-bn
                        other-rewrite unsorted-graph input-defaults weight-quant-gap verify-failed invalid-model
                        all none"
      # A comma list: complete the part after the last comma.
      local done_part="" last="$cur"
      if [[ "$cur" == *,* ]]; then done_part="${cur%,*},"; last="${cur##*,}"; fi
      COMPREPLY=($(compgen -P "$done_part" -W "$categories" -- "$last"))
      compopt -o nospace 2>/dev/null
      return ;;
    --rules)
      local rules prefix="" last="$cur" sign=""
      rules="default all none $(_bnfold_rules "${words[0]}")"
      if [[ "$cur" == *,* ]]; then prefix="${cur%,*},"; last="${cur##*,}"; fi
      if [[ "$last" == [+-]* ]]; then sign="${last:0:1}"; last="${last:1}"; fi
      COMPREPLY=($(compgen -P "$prefix$sign" -W "$rules" -- "$last"))
      compopt -o nospace 2>/dev/null
      return ;;
    --keep-op)
      COMPREPLY=($(compgen -W "BatchNormalization Conv ConvTranspose Gemm MatMul Add Mul" -- "$cur")); return ;;
    -o|--output|--report)
      COMPREPLY=($(compgen -f -- "$cur")); compopt -o filenames 2>/dev/null; return ;;
    --out-dir|--report-dir)
      COMPREPLY=($(compgen -d -- "$cur")); compopt -o filenames 2>/dev/null; return ;;
    -j|--jobs) COMPREPLY=($(compgen -W "1 2 4 8 $(nproc 2>/dev/null)" -- "$cur")); return ;;
    --keep|--backup-suffix) return ;;
  esac

  if [[ -z "$command" ]]; then
    COMPREPLY=($(compgen -W "info fold check $global_opts" -- "$cur"))
    return
  fi
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(_bnfold_options "${words[0]}" "$command") -v --verbose -q --quiet" -- "$cur"))
    return
  fi
  # Models: *.onnx files and folders.
  COMPREPLY=($(compgen -d -- "$cur") $(compgen -f -X '!*.onnx' -- "$cur"))
  compopt -o filenames 2>/dev/null
}

complete -F _bnfold bnfold
