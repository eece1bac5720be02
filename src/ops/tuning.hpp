#pragma once
// How every op picks its tuning knobs at call time: knobs the caller left at 0 ("auto") come from
// the tuning database for this device and problem-shape bucket (`mlajit tune` writes it), else
// from the built-in heuristic. Explicit knobs are kept as given. Hot path: one hashed in-memory
// lookup, no JSON, no allocation. At MLAJIT_LOG=info each distinct choice is logged once
// (ops/knob_choice.hpp).
#include <variant>

#include "mlajit/autotune.hpp"
#include "mlajit/log.hpp"
#include "mlajit/params.hpp"
#include "ops/knob_choice.hpp"

namespace mlajit::ops {

template <typename P>
P tuned_or_heuristic(const P& requested, const autotune::ShapeBucket& bucket) {
  // Every knob explicit: nothing to look up.
  const bool lookup = autotune::has_auto_knobs(requested);
  const OpParams* tuned = lookup ? autotune::tuned_params(requested, bucket) : nullptr;
  const P chosen = !lookup ? requested
                   : std::get<P>(with_heuristic_knobs(tuned ? autotune::fill_auto_knobs(requested, std::get<P>(*tuned))
                                                            : requested));
  if (static_cast<int>(log::level()) >= static_cast<int>(log::Level::info))
    log_knob_choice(requested, chosen, tuned != nullptr, bucket);
  return chosen;
}

// The size of dimension d of a view, 0 when it has no such dimension (shape checks come later).
inline int64_t dim_or_zero(const TensorView& t, int d) { return d < t.ndim ? t.shape[d] : 0; }

}  // namespace mlajit::ops
