#pragma once
// The Hopper sparse prefill's block schedule (Config::kBlockSchedule; sparse_prefill/sm90.cuh says
// what the kernel does): the consumer warpgroups' roles when each 64-key block is handled by both
// of them before the next, FlashMLA's sparse decode schedule.
//   WG0: S = Q K^T of block b (stage b % 2, all 9 tiles), the online softmax (the running max and
//        row sums are WG0's alone), P into the stage's rope tile (read by Q K^T only, so free once
//        S is done), the rows' rescale factors and max into `xfer`, then O[:, 0:256] += P V left.
//   WG1: waits for block b's P, rescales O[:, 256:512] by WG0's factors, O += P V right.
// A stage's left half is freed by WG0 after its P V, its right half by WG0 after Q K^T and by WG1
// after its P V: each block frees its stage as soon as both are done with it, so the producer
// fills block b + 2 while b + 1 is computed. (The prefill schedule holds both blocks of a step
// until the step's last P V.) WG0 runs at most two blocks ahead of WG1: its Q K^T of block b + 2
// waits for the stage WG1 frees after block b, so one phase of p_full per stage is ever pending.
// A last step whose second block lies past topk_len (a split part of odd blocks, a row of at most
// 64 (2 k + 1) keys) skips that block, all of whose rows are invalid: WG0 only waits for its halves
// to be full, so that the producers' stores into this CTA (the crossover peer's st.async too) have
// landed before it exits; nothing releases them, as nothing refills them.
#include "sparse_prefill/sm90_config.cuh"
#include "sparse_prefill/sm90_consumer.cuh"

namespace mj {
namespace sparse_prefill_sm90 {

// A stage as a type: the loops below handle blocks in pairs, stage 0 then 1, so that every
// shared-memory address and barrier is a constant (a run-time stage index put the Smem view in
// local memory).
template <int ST>
struct StageC {
  static constexpr int value = ST;
};

template <class C>
MJ_DEVICE void block_wg0(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                         int steps, int topk_len, float q_unscale, int slot) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float p[32];
  u32 ps[16];
  float m0 = kMaxInit, m1 = kMaxInit, l0 = 0.0f, l1 = 0.0f;
  const float mult = score_multiplier<C>(a, q_unscale);
  const u64 dq = sm90::smem_desc_sw128(s.q, 16, 1024);
  auto block = [&](auto stage, u32 parity) {
    constexpr int st = decltype(stage)::value;
    const u64 dk = sm90::smem_desc_sw128(s.k[st], 16, 1024);
    const u64 dv = sm90::smem_desc_sw128(s.k[st], kTileBytes, 1024);  // V left: tiles 0..3
    wait_full<C>(s, st, 0, parity);
    issue_qk<0, kLeftTiles, C::kF16>(p, dq, dk, true);
    wait_full<C>(s, st, 1, parity);
    issue_qk<kLeftTiles, kQkTiles, C::kF16>(p, dq, dk, false);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(p);
    // WG0's share of the right half: scored. P is still written into its rope tile below; the half
    // is refilled only once WG1 has released it too, after its P V read P.
    release_half<C>(s, s.empty[st][1]);

    float mx0, mx1;
    scale_mask_scores<C::kColScale>(p, s.bias, s.colscale, st * 64, ln, mult, mult, mx0, mx1);
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float alpha0 = fast_exp2(m0 - n0), alpha1 = fast_exp2(m1 - n1);
    scale_rows(o, alpha0, alpha1);
    l0 *= alpha0;
    l1 *= alpha1;
    exponentiate<C>(p, s, st, ln, n0, n1, l0, l1);
    m0 = n0;
    m1 = n1;
    pack_p<C::kF16>(p, ps);
    store_p(s.k[st] + 8 * kTileBytes, ps, ln, lane);
    if (ln.tig == 0) {
      s.xfer[st * 64 + ln.r0] = alpha0;
      s.xfer[st * 64 + ln.r1] = alpha1;
      s.xfer[128 + st * 64 + ln.r0] = n0;
      s.xfer[128 + st * 64 + ln.r1] = n1;
    }
    sm90::fence_proxy_async_smem();  // P is read by WG1's wgmma (async proxy)
    sm90::mbar_arrive(s.p_full[st]);

    sm90::wgmma_fence();
    issue_pv_rs<C::kF16>(o, ps, dv);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    release_half<C>(s, s.empty[st][0]);  // the left half: scored and multiplied
  };
  // The loop leaves between a step's blocks when its second one is past topk_len (a conditional
  // exit, not a branch around the second block's MMAs, which made ptxas move both accumulators
  // to local memory).
  const int live_blocks = (topk_len + kBlockKeys - 1) / kBlockKeys;
  for (int step = 0; step < steps; ++step) {
    block(StageC<0>{}, static_cast<u32>(step) & 1u);
    if (2 * step + 1 >= live_blocks) {  // the skipped block (above)
      wait_full<C>(s, 1, 0, static_cast<u32>(step) & 1u);
      wait_full<C>(s, 1, 1, static_cast<u32>(step) & 1u);
      break;
    }
    block(StageC<1>{}, static_cast<u32>(step) & 1u);
  }
  finish<C>(a, s, ln, lane, token, head0, o, m0, m1, l0, l1, 0u, slot);
}

template <class C>
MJ_DEVICE void block_wg1(const SparsePrefillArgs& a, const Smem& s, const Lane& ln, int lane, i64 token, int head0,
                         int steps, int topk_len, int slot) {
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float m0 = kMaxInit, m1 = kMaxInit;
  auto block = [&](auto stage, u32 parity) {
    constexpr int st = decltype(stage)::value;
    const u64 dv = sm90::smem_desc_sw128(s.k[st] + kLeftTiles * kTileBytes, kTileBytes, 1024);  // V right: 4..7
    const u64 dp = sm90::smem_desc_sw128(s.k[st] + 8 * kTileBytes, 16, 1024);                   // P: the rope tile
    sm90::mbar_wait(s.p_full[st], parity);
    // The right half's data landed before WG0 scored it (this phase of full is complete, and the
    // next cannot begin before this warpgroup frees the half); the wait orders it for this one.
    wait_full<C>(s, st, 1, parity);
    const float alpha0 = s.xfer[st * 64 + ln.r0], alpha1 = s.xfer[st * 64 + ln.r1];
    m0 = s.xfer[128 + st * 64 + ln.r0];
    m1 = s.xfer[128 + st * 64 + ln.r1];
    scale_rows(o, alpha0, alpha1);
    sm90::wgmma_fence();
    issue_pv_ss<C::kF16>(o, dp, dv);
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(o);
    release_half<C>(s, s.empty[st][1]);  // WG1's share of the right half (and P): multiplied
  };
  const int live_blocks = (topk_len + kBlockKeys - 1) / kBlockKeys;
  for (int step = 0; step < steps; ++step) {
    block(StageC<0>{}, static_cast<u32>(step) & 1u);
    if (2 * step + 1 >= live_blocks) break;  // the skipped block: WG0 waits for its halves
    block(StageC<1>{}, static_cast<u32>(step) & 1u);
  }
  // The row sums are WG0's: finish adds both warpgroups' (this one's are 0).
  finish<C>(a, s, ln, lane, token, head0, o, m0, m1, 0.0f, 0.0f, 0u, slot);
}

}  // namespace sparse_prefill_sm90
}  // namespace mj
