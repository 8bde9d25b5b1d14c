#!/usr/bin/env bash
# The live view's final screen as text, for the README: runs `specgen run` in a detached
# tmux pane of 100 columns and prints the pane once the command has exited.
#   scripts/capture_live.sh [specgen run arguments...]
# (default: -n 128 --temp 0 --ignore-eos --draft-max 8 "Once upon a time", the demo pair)
set -euo pipefail
cd "$(dirname "$0")/.."
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-n 128 --temp 0 --ignore-eos --draft-max 8 "Once upon a time")
sock="specgen-capture-$$"
cmd="clear; .venv/bin/specgen run $(printf '%q ' "${args[@]}"); echo SPECGEN-EXIT=\$?"
tmux -L "$sock" new-session -d -x 100 -y 60 -s cap "bash --norc"
trap 'tmux -L "$sock" kill-server 2>/dev/null || true' EXIT
tmux -L "$sock" send-keys -t cap "$cmd" Enter
until tmux -L "$sock" capture-pane -p -t cap | grep -q "SPECGEN-EXIT="; do sleep 1; done
tmux -L "$sock" capture-pane -p -J -t cap -S - | sed -n '/SPECGEN-EXIT=/q;p' | sed 's/[[:space:]]*$//'
