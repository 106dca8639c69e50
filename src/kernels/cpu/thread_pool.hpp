// The threads of the CPU kernels: a pool whose idle threads block at once
// (a condition variable) instead of spinning. OpenMP's idle threads spin
// after every parallel region (libgomp: GOMP_SPINCOUNT, up to
// milliseconds); when ranks share cores, that spinning takes the cores a
// peer rank needs (4 ranks of 2 threads on 2 cores ran 3-100x slower than 1
// thread), and OMP_WAIT_POLICY, which would stop it, is the whole process's
// setting, not the library's. Which thread runs which item never changes a
// result: the kernels' items (sum blocks, element ranges) are fixed.
#pragma once
#include <cstdint>
#include <functional>

namespace dsopt {

// fn(i) for every i in [0, n), on up to `threads` threads, the caller one
// of them; returns once every call has returned. Items are claimed a few at
// a time, so a thread that starts late (its core busy) takes fewer. While
// another call is in progress (another optimizer's, on another thread), or
// from inside fn, this one runs on the caller alone.
void parallel_for(int threads, int64_t n, const std::function<void(int64_t)>& fn);

}  // namespace dsopt
