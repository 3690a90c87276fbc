// Helpers shared by the support library (flowdsl_support.cu), its GIN part (flowdsl_gin.cu) and
// the CFT library (flowdsl_cft.cu).
//
// Included by those sources only (not a public header): everything here is internal to each
// translation unit. Needs flowdsl_support.h first (flowdsl_wait_check is defined in
// flowdsl_support.cu and called by the bounded waits of both).
#pragma once

#define FLOWDSL_FOR_EACH_COOP(X) X(thread) X(warp) X(lanes) X(warp_span) X(cta)

namespace flowdsl_detail {
__device__ __noinline__ void record_timeout(uint64_t* rec, int what, int peer, uint32_t index,
                                            uint64_t expected, uint64_t seen, uint64_t waited_ns);
}  // namespace flowdsl_detail

namespace {

// A coop crosses the ABI as one word: the lane mask for ncclCoopLanes,
// warp0 | nWarps << 8 | id << 16 for ncclCoopWarpSpan, unused otherwise.
__device__ __forceinline__ ncclCoopThread coop_thread(uint32_t) { return ncclCoopThread(); }
__device__ __forceinline__ ncclCoopWarp coop_warp(uint32_t) { return ncclCoopWarp(); }
__device__ __forceinline__ ncclCoopLanes coop_lanes(uint32_t w) { return ncclCoopLanes(w); }
__device__ __forceinline__ ncclCoopWarpSpan coop_warp_span(uint32_t w) {
  return ncclCoopWarpSpan(w & 0xff, (w >> 8) & 0xff, (w >> 16) & 0xff);
}
__device__ __forceinline__ ncclCoopCta coop_cta(uint32_t) { return ncclCoopCta(); }

__device__ __forceinline__ ncclTeam make_team(int nranks, int rank, int stride) {
  ncclTeam t;
  t.nRanks = nranks;
  t.rank = rank;
  t.stride = stride;
  return t;
}

__device__ __forceinline__ void store_team(ncclTeam t, int* out) {
  out[0] = t.nRanks;
  out[1] = t.rank;
  out[2] = t.stride;
}


// ---- bounded waits ------------------------------------------------------------
// A device communicator travels as ncclDevComm's words and one word more: the address of
// its communicator's wait record, host-mapped memory the host reads while kernels run
// (0: waits are unbounded). Word indices, shared with flowdsl/runtime/wait_record.py:
enum : int {
  kStop = 0,       // 0 running; 1 the host aborted; 2 a wait timed out (the record below is its)
  kDone = 1,       // 1 once the record's fields are written (released after them)
  kWhat = 2, /* 3: unused (the host names its communicator's rank) */ kBlock = 4, kThread = 5, kExpected = 6, kSeen = 7, kPeer = 8, kIndex = 9,
  kWaitedNs = 10,  // how long the first wait to give up had waited
  kTimeoutNs = 11, // the limit (host-written; 0: off)
};
// What a wait waits on (flowdsl/wait.py has the same values).
enum : int {
  kLsaBarrier = 5, kGinSignal = 6, kGinCounter = 7, kGinBarrier = 8, kHybridBarrier = 9, kCftCounter = 10,
  kCftBarrier = 11,
};
constexpr uint64_t kGaveUp = ~0ull;
constexpr uint64_t kSpinMask = 1023;  // flowdsl.wait.CHECK_EVERY - 1

__device__ __forceinline__ uint64_t* wait_record(const ncclDevComm* comm) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<const uint64_t*>(comm)[(sizeof(ncclDevComm) + 7) / 8]);
}
__device__ __forceinline__ uint64_t global_timer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t load_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The first wait to give up claims the record (defined once, in flowdsl_support.cu: a kernel
// that links the GIN library too gets one copy of this cold function).
using flowdsl_detail::record_timeout;

// One iteration of a bounded wait (flowdsl.wait.poll in C++): false once it must stop.
__device__ __forceinline__ bool keep_waiting(const ncclDevComm* comm, uint64_t& state, int what, int peer,
                                             uint32_t index, uint64_t expected, uint64_t seen) {
  uint64_t spins = (state + 1) & kSpinMask;
  state = (state & ~kSpinMask) | spins;
  if (spins == 1) state = flowdsl_wait_check(wait_record(comm), state, what, peer, index, expected, seen);
  return state != kGaveUp;
}

// ncclLsaBarrierSession::wait with every spin bounded (the same loads, orders and epoch
// updates as NCCL's; a wait that gives up leaves the loop as NCCL's abort does).
template <typename Coop>
__device__ __forceinline__ void bounded_lsa_wait(ncclLsaBarrierSession<Coop>& s, const ncclDevComm* comm,
                                                 cuda::memory_order order) {
  if (s.multimem) {
#if __CUDA_ARCH__ >= 900
    if (s.coop.thread_rank() == 0) {
      cuda::atomic_ref<uint32_t> inbox(*s.mcInbox(/*multimem=*/false));
      uint32_t need = s.epoch + s.team.nRanks;
      uint64_t state = 0;
#pragma unroll 1
      while (true) {
        uint32_t got = inbox.load(nccl::utility::acquireOrderOf(order));
        if (got - need <= uint32_t(-1) >> 1) break;
        if (!keep_waiting(comm, state, kLsaBarrier, -1, s.index, need, got)) break;
      }
      s.epoch += s.team.nRanks;
    }
#endif
  } else {
    bool gave_up = false;
#pragma unroll 1
    for (int i = s.coop.thread_rank(); i < s.team.nRanks - 1 && !gave_up; i += s.coop.size()) {
      int peer = i + (s.team.rank <= i ? 1 : 0);
      cuda::atomic_ref<uint32_t> inbox(*s.ucInbox(s.team.rank, peer));
      uint64_t state = 0;
#pragma unroll 1
      while (true) {
        uint32_t got = inbox.load(nccl::utility::acquireOrderOf(order));
        if (got - (s.epoch + 1) <= uint32_t(-1) >> 1) break;
        if (!keep_waiting(comm, state, kLsaBarrier, ncclTeamRankToWorld(*comm, s.team, peer), s.index,
                          s.epoch + 1, got)) {
          gave_up = true;
          break;
        }
      }
    }
    s.epoch += 1;
  }
  s.coop.sync();
}

}  // namespace
