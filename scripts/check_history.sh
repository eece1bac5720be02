#!/usr/bin/env bash
# Fails when a tracked file refers to the history of the work instead of the product: numbered
# sessions, stops, rounds or notes items, lettered device calls, version-numbered kernel designs
# ("v10"), branches that do not exist, or a design document other than docs/design.md. A figure is
# identified by GPU, date, commit and the command that reproduces it; a design by what it is.
# Exceptions: scripts/check_history.allow (PATH, or PATH:REGEX for the matching lines only).
# Run by scripts/test.sh (CI); takes well under a second.
set -uo pipefail
cd "$(dirname "$0")/.."
allow_file=scripts/check_history.allow
self=(":(exclude)scripts/check_history.sh" ":(exclude)$allow_file")

patterns=(
  -e '\b[Ss]essions? [0-9]+'
  -e '\b[Ss]tops? [0-9]+'
  -e '\b[Rr]ounds? [0-9]+'
  -e '(^|[^-])\b[Cc]alls? [A-Z][0-9]?\b'
  -e '\b[Nn]otes?( items?)? [0-9]+'
  -e '\b[Ii]tems? [0-9]+(-[0-9]+)?( of (the )?notes)?\b.*notes|\bnotes\b.*\b[Ii]tems? [0-9]+'
  -e '(^|[[:space:](/,"])v([4-9]|1[0-9])\b'
  -e '\bv[0-9]+ (of the|->)|\b(scorer|top-k|topk|KV ops) v[0-9]+\b|\bv[0-9]+.s note'
  -e 'docs/notes/'
)

allowed() {  # allowed PATH LINE
  local path=$1 text=$2 rule p r
  while IFS= read -r rule; do
    [[ -z "$rule" || "$rule" == \#* ]] && continue
    p=${rule%%:*}
    if [[ "$rule" == *:* ]]; then r=${rule#*:}; else r=''; fi
    [[ "$path" == "$p" ]] || continue
    [[ -z "$r" ]] && return 0
    [[ "$text" =~ $r ]] && return 0
  done < "$allow_file"
  return 1
}

fail=0
report() { echo "$1"; fail=1; }

# 1. history patterns
while IFS= read -r hit; do
  path=${hit%%:*}; rest=${hit#*:}; text=${rest#*:}
  allowed "$path" "$text" || report "history reference: $hit"
done < <(git grep -nIE "${patterns[@]}" -- . "${self[@]}")

# 2. branches named in the text must exist
while IFS= read -r hit; do
  path=${hit%%:*}; text=${hit#*:}; text=${text#*:}
  for name in $(grep -oE 'branch `[^`]+`|on branch [A-Za-z0-9._/-]+' <<<"$text" | sed -E 's/^(on )?branch `?//; s/`$//'); do
    git show-ref --quiet --verify "refs/heads/$name" || git show-ref --quiet --verify "refs/remotes/origin/$name" ||
      allowed "$path" "$text" || report "branch that does not exist ($name): $hit"
  done
done < <(git grep -nIE 'branch `[^`]+`|on branch [A-Za-z0-9._/-]+' -- . "${self[@]}")

# 3. the design document is docs/design.md, and a cited section exists
while IFS= read -r hit; do report "the design document is docs/design.md: $hit"; done \
  < <(git grep -nE '(^|[^/a-z])DESIGN[.]md' -- . "${self[@]}")
while IFS= read -r hit; do
  section=$(grep -oE 'docs/design\.md,? "[^"]+"' <<<"$hit" | sed -E 's/.*"(.*)"/\1/')
  [[ -z "$section" ]] && continue
  grep -qxE "#+ $(sed 's/[][\.*^$/]/\\&/g' <<<"$section")" docs/design.md || report "no section \"$section\" in docs/design.md: $hit"
done < <(git grep -nE 'docs/design\.md,? "[^"]+"' -- . "${self[@]}")

if [[ $fail -ne 0 ]]; then
  echo "check_history: the lines above refer to the history of the work (or to a missing design section)." >&2
  echo "Describe the product instead (a figure: GPU, date, commit, command); exceptions: $allow_file" >&2
  exit 1
fi
echo "check_history: clean"
