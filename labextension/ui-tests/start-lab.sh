#!/usr/bin/env bash
# A throwaway JupyterLab for the browser test: its own root, settings and workspaces under
# test-artifacts/lab, this checkout's prebuilt extension, no token, bound to 127.0.0.1.
set -euo pipefail
ext="$(cd "$(dirname "$0")/.." && pwd)"
repo="$(cd "$ext/.." && pwd)"
venv="${VENV:-$repo/.venv}"
work="$repo/test-artifacts/lab"
rm -rf "$work"
mkdir -p "$work/root" "$work/settings" "$work/workspaces" "$work/labextensions" "$work/config"
ln -s "$repo/jupyter_dist/labextension" "$work/labextensions/jupyter-dist"
cp "$ext/ui-tests/dist.ipynb" "$work/root/dist.ipynb"
# no "official Jupyter news?" toast over the screenshots
mkdir -p "$work/settings/@jupyterlab/apputils-extension"
echo '{"fetchNews": "false"}' > "$work/settings/@jupyterlab/apputils-extension/notification.jupyterlab-settings"
export PATH="$venv/bin:$PATH"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export JUPYTER_CONFIG_DIR="$work/config"
exec jupyter lab --no-browser --allow-root \
  --ServerApp.ip=127.0.0.1 --ServerApp.port="${UI_PORT:-8899}" --ServerApp.port_retries=0 \
  --IdentityProvider.token= --ServerApp.password= --ServerApp.disable_check_xsrf=True \
  --ServerApp.root_dir="$work/root" \
  --LabApp.user_settings_dir="$work/settings" --LabApp.workspaces_dir="$work/workspaces" \
  --LabServerApp.extra_labextensions_path="$work/labextensions" \
  --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate
