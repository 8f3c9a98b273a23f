#!/usr/bin/env bash
# Render an accelerator-search report.html to a PNG with headless Chromium (the picture in docs/accelerators.md).
#   bash docs/screenshot_report.sh [REPORT.html] [OUT.png]
# Defaults: runs `tuner search search_spaces/accelerators.yaml --out out/accelerators` if the report
# is missing, and writes docs/img/accelerator_report.png. Needs `chromium` (apt-get install -y chromium);
# CI does not run this.
set -euo pipefail
cd "$(dirname "$0")/.."
REPORT=${1:-out/accelerators/report.html}
PNG=${2:-docs/img/accelerator_report.png}
if [ ! -f "$REPORT" ]; then
  .venv/bin/tuner search search_spaces/accelerators.yaml --out "$(dirname "$REPORT")" --quiet
fi
BROWSER=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$BROWSER" ]; then
  echo "error: no chromium found (apt-get install -y chromium)" >&2
  exit 2
fi
mkdir -p "$(dirname "$PNG")"
"$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
  --window-size=1320,2200 --screenshot="$(realpath -m "$PNG")" "file://$(realpath "$REPORT")" 2>/dev/null
echo "wrote $PNG"
