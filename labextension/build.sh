#!/usr/bin/env bash
# Build and test the JupyterLab extension. Usage: labextension/build.sh [build|jest|ui|clean]
#   build  jlpm install, tsc, jupyter-builder build  -> jupyter_dist/labextension/ (prebuilt)
#   jest   the unit tests (protocol, model, cell text, kernel link)
#   ui     the browser test: real JupyterLab + /usr/bin/chromium via Playwright (needs build)
# Tools come from the project's venv (jlpm, jupyter-builder, jupyter-lab); override with VENV.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${VENV:-$here/../.venv}"
export PATH="$venv/bin:$PATH"
cd "$here"

case "${1:-build}" in
  build)
    jlpm install
    jlpm build:lib
    jlpm build:labextension
    ;;
  jest)
    [ -d node_modules ] || jlpm install
    jlpm test
    ;;
  ui)
    [ -f ../jupyter_dist/labextension/package.json ] || "$0" build
    jlpm playwright test
    ;;
  clean)
    rm -rf lib tsconfig.tsbuildinfo ../jupyter_dist/labextension
    ;;
  *)
    echo "usage: $0 [build|jest|ui|clean]" >&2
    exit 2
    ;;
esac
