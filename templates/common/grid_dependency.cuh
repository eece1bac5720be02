#pragma once
// Programmatic dependent launch (sm_90+): a kernel launched with the host's LaunchDims::programmatic
// may begin while the kernel before it on the stream still runs, once every CTA of that kernel has
// signalled (launch_dependents) or exited. It must wait (wait_prerequisites) before it reads what
// the earlier kernel writes: the wait returns when that grid has completed and its memory is
// visible. Loads after the wait are plain ld.global: a non-coherent (__ldg) load may be scheduled
// early, and what it could see of the earlier grid's writes is not defined.
// Older targets: both are no-ops (the host launches programmatically only on sm_90 and newer, and
// without that attribute the stream already orders the two kernels).
#include "common/types.cuh"

namespace mj {
namespace grid_dependency {

// This CTA's share of letting the dependent grid launch: its CTAs can then take SMs this grid
// leaves free (their launch latency hidden behind this grid's tail) and wait there.
MJ_DEVICE void launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Waits for the prerequisite grid's completion and the visibility of its memory operations.
MJ_DEVICE void wait_prerequisites() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace grid_dependency
}  // namespace mj
