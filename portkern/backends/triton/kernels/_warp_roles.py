# --- included from _warp_roles.py: the register split of Gluon kernels with two consumer warpgroups and a
# producer warp (gl.warp_specialize) ---
_WARPGROUP_THREADS = 128
# constexprs: the kernels read them in gl.warp_specialize
_CONSUMER_REGISTERS = tl.constexpr(240)  # each consumer thread's, by setmaxnreg
_LOADER_REGISTERS = tl.constexpr(24)  # the producer warp's: it issues TMA copies and waits
_MAX_REGISTERS = 168  # the launch's per-thread cap: 2 x 128 x 240 + 128 x 24 fits 384 threads in 64K
_BARRIER_BYTES = 512  # the mbarriers with the compiler's padding
