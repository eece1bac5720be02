#pragma once
// How every op picks its tuning knobs at call time: knobs the caller left at 0 ("auto") come from
// the tuning database for this device and problem-shape bucket (`mlajit tune` writes it), else
// from the built-in heuristic. Explicit knobs are kept as given. Hot path: one hashed in-memory
// lookup, no JSON, no allocation.
#include <variant>

#include "mlajit/autotune.hpp"
#include "mlajit/params.hpp"

namespace mlajit::ops {

template <typename P>
P tuned_or_heuristic(const P& requested, const autotune::ShapeBucket& bucket) {
  if (!autotune::has_auto_knobs(requested)) return requested;  // every knob explicit: nothing to look up
  const KernelSpec tuned = autotune::apply_tuning(KernelSpec{requested}, bucket);
  return std::get<P>(with_heuristic_knobs(tuned.params));
}

// The size of dimension d of a view, 0 when it has no such dimension (shape checks come later).
inline int64_t dim_or_zero(const TensorView& t, int d) { return d < t.ndim ? t.shape[d] : 0; }

}  // namespace mlajit::ops
