#pragma once
// What an op call ran with, for MLAJIT_LOG=info: the knobs it chose and where each came from (the
// call's params, a tuning record, the built-in heuristic, or the op's launch plan), logged once per
// distinct (problem, shape bucket, choice) in a process rather than once per call, so that a user
// can see which variant served which shapes without drowning in lines.
#include <string>

#include "mlajit/autotune.hpp"
#include "mlajit/params.hpp"

namespace mlajit::ops {

// One line, e.g. "kv_cache_store for bucket tokens=65536,batch=8 runs kv_cache_store_..._thr256:
// threads=256 (tuned)"; a knob's origin is params, tuned, heuristic, or plan (still auto: the
// op's launch plan sizes it). `requested` is the call's params (0 = auto), `chosen` what runs (same
// op), `tuned` whether a tuning record filled the auto knobs.
std::string describe_knob_choice(const OpParams& requested, const OpParams& chosen, bool tuned,
                                 const autotune::ShapeBucket& bucket);

// Logs describe_knob_choice() at info level the first time this choice is seen in the process.
// Callers check the level first, so that a call below info costs one integer compare.
void log_knob_choice(const OpParams& requested, const OpParams& chosen, bool tuned, const autotune::ShapeBucket& bucket);

}  // namespace mlajit::ops
