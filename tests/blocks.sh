# Sourced by the scripts that run a document's marked blocks (tests/readme-walkthrough.sh, tests/sdk-ts-check.sh).
# block FILE NAME prints the lines between <!-- NAME:begin --> and <!-- NAME:end -->, without the code fences and
# markers. It fails, saying so, unless FILE has each marker exactly once, begin first.
block() {
  local file=$1 name=$2 begin end
  begin=$(grep -nxF -- "<!-- $name:begin -->" "$file" | cut -d: -f1 | paste -sd, - || true)
  end=$(grep -nxF -- "<!-- $name:end -->" "$file" | cut -d: -f1 | paste -sd, - || true)
  if ! [[ $begin =~ ^[0-9]+$ && $end =~ ^[0-9]+$ ]] || [ "$begin" -ge "$end" ]; then
    echo "${0##*/}: $file needs <!-- $name:begin --> and <!-- $name:end --> once each, begin first" \
      "(begin at line ${begin:-none}, end at line ${end:-none})" >&2
    return 1
  fi
  sed -n "$((begin + 1)),$((end - 1))p" "$file" | sed '/^```/d; /^<!--/d'
}
