# Sourced by scripts: where cached tools live. One cache per machine, shared by every clone,
# so CI reuses what an earlier run built.
export TPUSERVE_CACHE=${TPUSERVE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tpuserve}
export TPUSERVE_TOOLS_BIN=$TPUSERVE_CACHE/tools/bin
export PATH=$TPUSERVE_TOOLS_BIN:$PATH
