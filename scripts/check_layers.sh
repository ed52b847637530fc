#!/usr/bin/env bash
# Include-direction check: no layer includes a header of a layer above it (headers too, not only link symbols).
#   cli/server -> runtime -> model -> backend -> quant/gguf/util   (docs/ARCHITECTURE.md, "Layers"); grammar and
#   template sit beside util (runtime, server and cli may include them)
# Each src/<layer> may include only the layers listed for it (its own included). Below the folder level, a
# sub-folder is private to itself: a header in src/<layer>/<sub>/ (backend/cpu, backend/cuda, model/arch) is
# included only by files of that same sub-folder. So the generic backend interface (backend/*) never includes a
# specific backend, and every layer above (cli, the model) reaches backends only through backend/registry.h and
# the interface. Runs as a ctest (layers_include_direction) and exits non-zero naming every offending file and line.
set -euo pipefail
cd "$(dirname "$0")/../src"
declare -A allowed=(
  [util]="util"
  [quant]="quant util"
  [gguf]="gguf quant util"
  [tokenizer]="tokenizer gguf quant util"
  [template]="template util"
  [grammar]="grammar util"
  [backend]="backend quant util"
  [model]="model backend gguf tokenizer quant util"
  [runtime]="runtime model backend tokenizer template grammar gguf quant util"
  [server]="server runtime tokenizer template grammar util"
  [cli]="cli server runtime model backend tokenizer template grammar gguf quant util"
)
bad=0
for layer in */; do
  layer=${layer%/}
  if [ -z "${allowed[$layer]+x}" ]; then
    echo "check_layers: src/$layer is not a known layer: add it to scripts/check_layers.sh with its allowed includes"
    bad=1
    continue
  fi
  while IFS=: read -r file line inc; do
    [[ $inc =~ \#include\ \"([a-z_]+)/ ]] || continue
    target=${BASH_REMATCH[1]}
    [ -n "${allowed[$target]+x}" ] || continue           # not a kiln layer (e.g. "common/...")
    if [[ " ${allowed[$layer]} " != *" $target "* ]]; then
      echo "src/$file:$line: $layer includes $target (allowed: ${allowed[$layer]}): $inc"
      bad=1
    fi
  done < <(grep -rnE '^\s*#\s*include "[a-z_]+/' "$layer" --include='*.h' --include='*.cpp' --include='*.cu' \
             --include='*.cuh' || true)
done
# Sub-folders: their headers are theirs alone.
while IFS=: read -r file line inc; do
  [[ $inc =~ \#include\ \"([a-z_]+/[a-z_]+)/ ]] || continue
  target=${BASH_REMATCH[1]}
  [ -d "$target" ] || continue                          # "layer/file.h": no sub-folder
  case "$file" in
    "$target"/*) ;;                                     # inside the sub-folder itself
    *) echo "src/$file:$line: includes a header private to src/$target/ (reach it through its layer's interface," \
            "e.g. backend/registry.h): $inc"
       bad=1 ;;
  esac
done < <(grep -rnE '^\s*#\s*include "[a-z_]+/[a-z_]+/' . --include='*.h' --include='*.cpp' --include='*.cu' \
           --include='*.cuh' | sed 's|^\./||' || true)
[ $bad -eq 0 ] && echo "check_layers: every include points down; sub-folders are included only from within"
exit $bad
