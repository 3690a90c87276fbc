// flowdsl support library: extern "C" wrappers over NCCL's Device API templates.
//
// Only pointers and scalars cross this boundary (no structs by value), so that
// numba can declare every function with the C ABI. The prototypes come from
// include/flowdsl_support.h, generated from flowdsl/lowering/externs.py; the
// compiler checks each definition below against it. Built to LTO-IR per
// (NCCL device ABI, arch) and inlined into user kernels by nvJitLink.
#include "flowdsl_support.h"

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
  kWhat = 2, kRank = 3, kBlock = 4, kThread = 5, kExpected = 6, kSeen = 7, kPeer = 8, kIndex = 9,
  kWaitedNs = 10,  // how long the first wait to give up had waited
  kTimeoutNs = 11, // the limit (host-written; 0: off)
  kClockKhz = 12,  // SM clock, for NCCL's own timeouts, which count cycles
};
// What a wait waits on (flowdsl/wait.py has the same values).
enum : int { kLsaBarrier = 5, kGinSignal = 6, kGinCounter = 7, kGinBarrier = 8, kHybridBarrier = 9 };
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

// The first wait to give up claims the record (the stop word, 0 -> 2) and fills it; an
// abort (1) or an earlier timeout leaves it as it is.
__device__ __noinline__ void record_timeout(const ncclDevComm* comm, int what, int peer, uint32_t index,
                                            uint64_t expected, uint64_t seen, uint64_t waited_ns) {
  uint64_t* rec = wait_record(comm);
  uint64_t old;
  asm volatile("atom.relaxed.sys.cas.b64 %0, [%1], %2, %3;" : "=l"(old) : "l"(rec + kStop), "l"(0ull), "l"(2ull)
               : "memory");
  if (old != 0) return;
  rec[kWhat] = (uint64_t)what;
  rec[kRank] = (uint64_t)comm->rank;
  rec[kBlock] = blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
  rec[kThread] = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  rec[kExpected] = expected;
  rec[kSeen] = seen;
  rec[kPeer] = (uint64_t)(int64_t)peer;
  rec[kIndex] = index;
  rec[kWaitedNs] = waited_ns;
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(rec + kDone), "l"(1ull) : "memory");
}

}  // namespace

// state: the wait's start time (ns, low bits cleared) | spins since the last check.
FLOWDSL_API uint64_t flowdsl_wait_check(const ncclDevComm* comm, uint64_t state, int what, int peer,
                                        uint32_t index, uint64_t expected, uint64_t seen) {
  uint64_t* rec = wait_record(comm);
  if (rec == nullptr) return state;
  uint64_t now = global_timer() & ~kSpinMask;
  uint64_t start = state & ~kSpinMask;
  if (start == 0) return now | (state & kSpinMask);  // the first check: the wait starts now
  if (load_relaxed_sys(rec + kStop) != 0) return kGaveUp;
  uint64_t timeout = load_relaxed_sys(rec + kTimeoutNs);
  if (timeout == 0 || now - start < timeout) return state;
  record_timeout(comm, what, peer, index, expected, seen, now - start);
  return kGaveUp;
}

namespace {

// One iteration of a bounded wait (flowdsl.wait.poll in C++): false once it must stop.
__device__ __forceinline__ bool keep_waiting(const ncclDevComm* comm, uint64_t& state, int what, int peer,
                                             uint32_t index, uint64_t expected, uint64_t seen) {
  uint64_t spins = (state + 1) & kSpinMask;
  state = (state & ~kSpinMask) | spins;
  if (spins == 1) state = flowdsl_wait_check(comm, state, what, peer, index, expected, seen);
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

// Thread 0 of the coop waits until signal (or counter) reaches least, as ncclGin::waitSignal.
template <bool Counter, typename Coop>
__device__ __forceinline__ void bounded_gin_wait(Coop coop, const ncclDevComm* comm, const ncclGin& net,
                                                 uint32_t id, uint64_t least, int bits, cuda::memory_order order,
                                                 int what, uint32_t index) {
  coop.sync();
  if (coop.thread_rank() == 0) {
    uint64_t state = 0;
#pragma unroll 1
    while (true) {
      uint64_t got = Counter ? net.readCounter(id, bits, order) : net.readSignal(id, bits, order);
      if (nccl::utility::rollingLessEq(least, got, bits)) break;
      if (!keep_waiting(comm, state, what, -1, index, least, got)) break;
    }
  }
  coop.sync();
}

#if NCCL_VERSION_CODE >= 23003
// NCCL >= 2.30.3 bounds its barrier sessions itself, in SM cycles (without watching any abort
// flag while it does); a timeout it reports fills flowdsl's record. Without a limit, the plain
// form, which watches NCCL's own abort flag (set by ncclCommAbort).
template <typename Session, typename Coop>
__device__ __forceinline__ void bounded_barrier_sync(Session& s, Coop c, const ncclDevComm* comm,
                                                     cuda::memory_order order, int what, uint32_t index) {
  uint64_t* rec = wait_record(comm);
  uint64_t timeout = rec ? load_relaxed_sys(rec + kTimeoutNs) : 0;
  if (timeout == 0) {
    s.sync(c, order, ncclGinFenceLevel::Relaxed);
    return;
  }
  uint64_t start = global_timer();
  uint64_t cycles = timeout * load_relaxed_sys(rec + kClockKhz) / 1000000;
  if (s.sync(c, order, ncclGinFenceLevel::Relaxed, cycles ? cycles : timeout) == ncclTimeout)
    record_timeout(comm, what, -1, index, 0, 0, global_timer() - start);
}
#else
// ncclGinBarrierSession::sync of NCCL < 2.30 with its spins bounded (same signals, orders
// and barrier state). 2.28 counts one signal per barrier in an epoch; 2.29 has one signal
// per peer and counts arrivals in the signals' shadows.
template <typename Coop>
__device__ __forceinline__ void bounded_gin_barrier_sync(ncclGinBarrierSession<Coop>& s, const ncclDevComm* comm,
                                                         cuda::memory_order ord, int what, uint32_t index) {
  auto scope = nccl::utility::releaseOrderOf(ord) != cuda::memory_order_relaxed ? cuda::thread_scope_thread
                                                                                 : cuda::thread_scope_system;
  s.coop.sync();
#if NCCL_VERSION_CODE >= 22900
  bool gave_up = false;
#pragma unroll 1
  for (int i = s.coop.thread_rank(); i < s.team.nRanks - 1; i += s.coop.size()) {
    int peer = 1 + s.team.rank + i;
    if (s.team.nRanks <= peer) peer -= s.team.nRanks;
    s.net.signal(s.team, peer, ncclGin_SignalInc{s.signal + s.team.rank}, ncclCoopThread(), ncclGin_None(), scope);
    uint32_t* shadow = (uint32_t*)s.net.getSignalShadowPtr(s.signal + peer);
    uint32_t need = ++*shadow;
    uint64_t state = 0;
#pragma unroll 1
    while (!gave_up) {
      uint64_t got = s.net.readSignal(s.signal + peer, 32, nccl::utility::acquireOrderOf(ord));
      if (nccl::utility::rollingLessEq((uint64_t)need, got, 32)) break;
      gave_up = !keep_waiting(comm, state, what, ncclTeamRankToWorld(*comm, s.team, peer), index, need, got);
    }
  }
#else
#pragma unroll 1
  for (int i = s.coop.thread_rank(); i < s.team.nRanks - 1; i += s.coop.size()) {
    int peer = 1 + s.team.rank + i;
    if (s.team.nRanks <= peer) peer -= s.team.nRanks;
    s.net.signal(s.team, peer, ncclGin_SignalInc{s.signal}, ncclCoopThread(), ncclGin_None(), scope);
  }
  s.epoch += s.team.nRanks - 1;
  if (s.coop.thread_rank() == 0) {
    uint64_t state = 0;
#pragma unroll 1
    while (true) {
      uint64_t got = s.net.readSignal(s.signal, 32, nccl::utility::acquireOrderOf(ord));
      if (nccl::utility::rollingLessEq((uint64_t)s.epoch, got, 32)) break;
      if (!keep_waiting(comm, state, what, -1, index, s.epoch, got)) break;
    }
  }
#endif
  s.coop.sync();
}
#endif

}  // namespace

#define FLOWDSL_FOR_EACH_COOP(X) X(thread) X(warp) X(lanes) X(warp_span) X(cta)

// ---- device communicator fields -------------------------------------------
FLOWDSL_API int flowdsl_comm_rank(const ncclDevComm* comm) { return comm->rank; }
FLOWDSL_API int flowdsl_comm_nranks(const ncclDevComm* comm) { return comm->nRanks; }
FLOWDSL_API int flowdsl_comm_lsa_rank(const ncclDevComm* comm) { return comm->lsaRank; }
FLOWDSL_API int flowdsl_comm_lsa_size(const ncclDevComm* comm) { return comm->lsaSize; }

// ---- coops ------------------------------------------------------------------
#define FLOWDSL_COOP_FUNCS(K)                                                         \
  FLOWDSL_API void flowdsl_coop_sync__##K(uint32_t coop) { auto c = coop_##K(coop); c.sync(); } \
  FLOWDSL_API int flowdsl_coop_thread_rank__##K(uint32_t coop) { return coop_##K(coop).thread_rank(); } \
  FLOWDSL_API int flowdsl_coop_size__##K(uint32_t coop) { return coop_##K(coop).size(); }
FLOWDSL_FOR_EACH_COOP(FLOWDSL_COOP_FUNCS)

// ---- teams ------------------------------------------------------------------
FLOWDSL_API void flowdsl_team_world(const ncclDevComm* comm, int* out) { store_team(ncclTeamWorld(*comm), out); }
FLOWDSL_API void flowdsl_team_lsa(const ncclDevComm* comm, int* out) { store_team(ncclTeamLsa(*comm), out); }
FLOWDSL_API void flowdsl_team_rail(const ncclDevComm* comm, int* out) { store_team(ncclTeamRail(*comm), out); }

FLOWDSL_API int flowdsl_team_rank_to_world(const ncclDevComm* comm, int team_nranks, int team_rank,
                                           int team_stride, int rank) {
  return ncclTeamRankToWorld(*comm, make_team(team_nranks, team_rank, team_stride), rank);
}
FLOWDSL_API int flowdsl_team_rank_to_lsa(const ncclDevComm* comm, int team_nranks, int team_rank,
                                         int team_stride, int rank) {
  return ncclTeamRankToLsa(*comm, make_team(team_nranks, team_rank, team_stride), rank);
}
FLOWDSL_API int flowdsl_team_rank_is_member(int a_nranks, int a_rank, int a_stride, int b_nranks,
                                            int b_rank, int b_stride, int b_peer) {
  return ncclTeamRankIsMember(make_team(a_nranks, a_rank, a_stride), make_team(b_nranks, b_rank, b_stride),
                              b_peer) ? 1 : 0;
}
FLOWDSL_API int flowdsl_team_rank_to_team(int a_nranks, int a_rank, int a_stride, int b_nranks, int b_rank,
                                          int b_stride, int b_peer) {
  return ncclTeamRankToTeam(make_team(a_nranks, a_rank, a_stride), make_team(b_nranks, b_rank, b_stride),
                            b_peer);
}
FLOWDSL_API void flowdsl_team_inner_factor(int team_nranks, int team_rank, int team_stride, int inner_size,
                                           int* out) {
  store_team(ncclTeamInnerFactor(make_team(team_nranks, team_rank, team_stride), inner_size), out);
}
FLOWDSL_API void flowdsl_team_outer_factor(int team_nranks, int team_rank, int team_stride, int inner_size,
                                           int* out) {
  store_team(ncclTeamOuterFactor(make_team(team_nranks, team_rank, team_stride), inner_size), out);
}
FLOWDSL_API int flowdsl_team_rank_in_difference(int parent_nranks, int parent_rank, int parent_stride,
                                                int subset_nranks, int subset_rank, int subset_stride,
                                                int index) {
  return ncclTeamRankInDifference(make_team(parent_nranks, parent_rank, parent_stride),
                                  make_team(subset_nranks, subset_rank, subset_stride), index);
}

// ---- window pointers ----------------------------------------------------------
FLOWDSL_API void* flowdsl_get_local_pointer(ncclWindow_t win, size_t offset) {
  return ncclGetLocalPointer(win, offset);
}
FLOWDSL_API void* flowdsl_get_lsa_pointer(ncclWindow_t win, size_t offset, int lsa_peer) {
  return ncclGetLsaPointer(win, offset, lsa_peer);
}
FLOWDSL_API void* flowdsl_get_peer_pointer(ncclWindow_t win, size_t offset, int peer) {
  return ncclGetPeerPointer(win, offset, peer);
}
FLOWDSL_API void* flowdsl_get_team_pointer(ncclWindow_t win, size_t offset, int team_nranks, int team_rank,
                                           int team_stride, int peer) {
  return ncclGetPeerPointer(win, offset, make_team(team_nranks, team_rank, team_stride), peer);
}

// ---- LSA barrier sessions -------------------------------------------------------
// Each call opens a session (which loads the barrier's epoch from NCCL's
// resource window) and closes it (which stores the epoch back), so Python
// code needs no destructor and later launches continue the epoch sequence.
// Waits are bounded (bounded_lsa_wait): NCCL's arrive, flowdsl's wait.
#define FLOWDSL_LSA_BARRIER_FUNCS(K)                                                          \
  FLOWDSL_API void flowdsl_lsa_barrier_arrive__##K(uint32_t coop, const ncclDevComm* comm,   \
                                                   uint32_t index, int order) {              \
    auto c = coop_##K(coop);                                                                  \
    ncclLsaBarrierSession<decltype(c)> s{c, *comm, ncclTeamTagLsa(), index};                 \
    s.arrive(c, (cuda::memory_order)order);                                                   \
  }                                                                                           \
  FLOWDSL_API void flowdsl_lsa_barrier_wait__##K(uint32_t coop, const ncclDevComm* comm,     \
                                                 uint32_t index, int order) {                \
    auto c = coop_##K(coop);                                                                  \
    ncclLsaBarrierSession<decltype(c)> s{c, *comm, ncclTeamTagLsa(), index};                 \
    bounded_lsa_wait(s, comm, (cuda::memory_order)order);                                     \
  }                                                                                           \
  FLOWDSL_API void flowdsl_lsa_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm,     \
                                                 uint32_t index, int order) {                \
    auto c = coop_##K(coop);                                                                  \
    ncclLsaBarrierSession<decltype(c)> s{c, *comm, ncclTeamTagLsa(), index};                 \
    s.arrive(c, (cuda::memory_order)order);                                                   \
    bounded_lsa_wait(s, comm, (cuda::memory_order)order);                                     \
  }
FLOWDSL_FOR_EACH_COOP(FLOWDSL_LSA_BARRIER_FUNCS)

// ---- GIN ----------------------------------------------------------------------------
// One C function per (remote action, local action, coop): the kernel states its signal
// kind at compile time, so each call inlines exactly one ncclGin::put instantiation.
// Remote actions read their operands from the common parameters (signal, signal_win,
// signal_offset, value); unused ones are zero.
#if NCCL_VERSION_CODE >= 23200
using LocalCounter = ncclGin_WeakCounterInc;
#define FLOWDSL_FOR_EACH_REMOTE_2_32(X, K)                                   \
  X(K, strong_signal_inc, ncclGin_StrongSignalInc{signal})                 \
  X(K, weak_signal_inc, ncclGin_WeakSignalInc{signal})                     \
  X(K, strong_signal_add, (ncclGin_StrongSignalAdd{signal, value}))        \
  X(K, weak_signal_add, (ncclGin_WeakSignalAdd{signal, value}))            \
  X(K, strong_va_signal_inc, (ncclGin_StrongVASignalInc{signal_win, signal_offset}))        \
  X(K, weak_va_signal_inc, (ncclGin_WeakVASignalInc{signal_win, signal_offset}))            \
  X(K, strong_va_signal_add, (ncclGin_StrongVASignalAdd{signal_win, signal_offset, value})) \
  X(K, weak_va_signal_add, (ncclGin_WeakVASignalAdd{signal_win, signal_offset, value}))
#else
using LocalCounter = ncclGin_CounterInc;
#define FLOWDSL_FOR_EACH_REMOTE_2_32(X, K)
#endif
#define FLOWDSL_FOR_EACH_SIGNAL(X, K)                                        \
  X(K, signal_inc, ncclGin_SignalInc{signal})                              \
  X(K, signal_add, (ncclGin_SignalAdd{signal, value}))                     \
  FLOWDSL_FOR_EACH_REMOTE_2_32(X, K)
#define FLOWDSL_FOR_EACH_REMOTE(X, K) X(K, none, ncclGin_None{}) FLOWDSL_FOR_EACH_SIGNAL(X, K)

#define FLOWDSL_GIN_PARAMS_TO_PEER                                                                    \
  uint32_t coop, const ncclDevComm* comm, int ctx, int team_nranks, int team_rank, int team_stride, int peer
#define FLOWDSL_GIN_PARAMS_REMOTE \
  uint32_t signal, ncclWindow_t signal_win, size_t signal_offset, uint64_t value

#define FLOWDSL_GIN_PUT(K, R, ACTION)                                                                 \
  FLOWDSL_API void flowdsl_gin_put__##R##__##K(FLOWDSL_GIN_PARAMS_TO_PEER, ncclWindow_t dst,          \
      size_t dst_offset, ncclWindow_t src, size_t src_offset, size_t bytes, FLOWDSL_GIN_PARAMS_REMOTE) {  \
    ncclGin(*comm, ctx).put(make_team(team_nranks, team_rank, team_stride), peer, dst, dst_offset, src, \
                            src_offset, bytes, ACTION, ncclGin_None{}, coop_##K(coop));               \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_put__##R##__counted__##K(FLOWDSL_GIN_PARAMS_TO_PEER, ncclWindow_t dst, \
      size_t dst_offset, ncclWindow_t src, size_t src_offset, size_t bytes, FLOWDSL_GIN_PARAMS_REMOTE,   \
      uint32_t counter) {                                                                             \
    ncclGin(*comm, ctx).put(make_team(team_nranks, team_rank, team_stride), peer, dst, dst_offset, src, \
                            src_offset, bytes, ACTION, LocalCounter{counter}, coop_##K(coop));        \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_put_value__##R##__##K(FLOWDSL_GIN_PARAMS_TO_PEER, ncclWindow_t dst,    \
      size_t dst_offset, uint64_t payload, int size, FLOWDSL_GIN_PARAMS_REMOTE) {                     \
    ncclGin net(*comm, ctx);                                                                          \
    ncclTeam team = make_team(team_nranks, team_rank, team_stride);                                   \
    switch (size) {                                                                                   \
      case 1: net.putValue(team, peer, dst, dst_offset, (uint8_t)payload, ACTION, coop_##K(coop)); break;  \
      case 2: net.putValue(team, peer, dst, dst_offset, (uint16_t)payload, ACTION, coop_##K(coop)); break; \
      case 4: net.putValue(team, peer, dst, dst_offset, (uint32_t)payload, ACTION, coop_##K(coop)); break; \
      default: net.putValue(team, peer, dst, dst_offset, payload, ACTION, coop_##K(coop)); break;          \
    }                                                                                                 \
  }
#define FLOWDSL_GIN_SIGNAL(K, R, ACTION)                                                              \
  FLOWDSL_API void flowdsl_gin_signal__##R##__##K(FLOWDSL_GIN_PARAMS_TO_PEER, FLOWDSL_GIN_PARAMS_REMOTE) { \
    ncclGin(*comm, ctx).signal(make_team(team_nranks, team_rank, team_stride), peer, ACTION, coop_##K(coop)); \
  }
#define FLOWDSL_GIN_PUTS_FOR_COOP(K) FLOWDSL_FOR_EACH_REMOTE(FLOWDSL_GIN_PUT, K)
#define FLOWDSL_GIN_SIGNALS_FOR_COOP(K) FLOWDSL_FOR_EACH_SIGNAL(FLOWDSL_GIN_SIGNAL, K)
FLOWDSL_FOR_EACH_COOP(FLOWDSL_GIN_PUTS_FOR_COOP)
FLOWDSL_FOR_EACH_COOP(FLOWDSL_GIN_SIGNALS_FOR_COOP)

#if NCCL_VERSION_CODE >= 23003
#define FLOWDSL_GIN_BARRIERS(K)                                                                       \
  FLOWDSL_API void flowdsl_gin_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,     \
                                                 uint32_t index, int order) {                         \
    ncclGin net(*comm, ctx);                                                                          \
    auto c = coop_##K(coop);                                                                          \
    ncclGinBarrierSession<decltype(c)> s{c, net, ncclTeamTagRail(), index};                          \
    bounded_barrier_sync(s, c, comm, (cuda::memory_order)order, kGinBarrier, index);                  \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_hybrid_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,  \
                                                    uint32_t index, int order) {                      \
    ncclGin net(*comm, ctx);                                                                          \
    auto c = coop_##K(coop);                                                                          \
    ncclBarrierSession<decltype(c)> s{c, ncclTeamTagWorld(), net, index};                            \
    bounded_barrier_sync(s, c, comm, (cuda::memory_order)order, kHybridBarrier, index);               \
  }
#else
// The hybrid barrier as ncclBarrierSession composes it: the LSA team's barrier, then the
// rail team's GIN barrier, each bounded.
#define FLOWDSL_GIN_BARRIERS(K)                                                                       \
  FLOWDSL_API void flowdsl_gin_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,     \
                                                 uint32_t index, int order) {                         \
    ncclGin net(*comm, ctx);                                                                          \
    auto c = coop_##K(coop);                                                                          \
    ncclGinBarrierSession<decltype(c)> s{c, net, ncclTeamTagRail(), index};                          \
    bounded_gin_barrier_sync(s, comm, (cuda::memory_order)order, kGinBarrier, index);                 \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_hybrid_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,  \
                                                    uint32_t index, int order) {                      \
    ncclGin net(*comm, ctx);                                                                          \
    auto c = coop_##K(coop);                                                                          \
    auto ord = (cuda::memory_order)order;                                                             \
    ncclLsaBarrierSession<decltype(c)> lsa{c, *comm, ncclTeamTagLsa(), index};                       \
    ncclGinBarrierSession<decltype(c)> rail{c, net, ncclTeamTagRail(), index};                       \
    lsa.arrive(c, nccl::utility::releaseOrderOf(ord));                                                \
    bounded_lsa_wait(lsa, comm, nccl::utility::releaseOrderOf(ord));                                  \
    bounded_gin_barrier_sync(rail, comm, nccl::utility::acquireOrderOf(ord), kHybridBarrier, index);  \
  }
#endif

#define FLOWDSL_GIN_COOP_FUNCS(K)                                                                      \
  FLOWDSL_API void flowdsl_gin_flush__##K(uint32_t coop, const ncclDevComm* comm, int ctx, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    net.flush(coop_##K(coop), (cuda::memory_order)order);                                             \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_wait_signal__##K(uint32_t coop, const ncclDevComm* comm, int ctx,      \
                                                uint32_t signal, uint64_t least, int bits, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    bounded_gin_wait<false>(coop_##K(coop), comm, net, signal, least, bits, (cuda::memory_order)order,  \
                            kGinSignal, signal);                                                      \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_wait_counter__##K(uint32_t coop, const ncclDevComm* comm, int ctx,     \
                                                 uint32_t counter, uint64_t least, int bits, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    bounded_gin_wait<true>(coop_##K(coop), comm, net, counter, least, bits, (cuda::memory_order)order,  \
                           kGinCounter, counter);                                                     \
  }                                                                                                   \
  FLOWDSL_GIN_BARRIERS(K)
FLOWDSL_FOR_EACH_COOP(FLOWDSL_GIN_COOP_FUNCS)

FLOWDSL_API uint64_t flowdsl_gin_read_signal(const ncclDevComm* comm, int ctx, uint32_t signal, int bits, int order) {
  ncclGin net(*comm, ctx);
  return net.readSignal(signal, bits, (cuda::memory_order)order);
}
FLOWDSL_API void flowdsl_gin_reset_signal(const ncclDevComm* comm, int ctx, uint32_t signal) {
  ncclGin net(*comm, ctx);
  net.resetSignal(signal);
}
FLOWDSL_API uint64_t flowdsl_gin_read_counter(const ncclDevComm* comm, int ctx, uint32_t counter, int bits,
                                              int order) {
  ncclGin net(*comm, ctx);
  return net.readCounter(counter, bits, (cuda::memory_order)order);
}
FLOWDSL_API void flowdsl_gin_reset_counter(const ncclDevComm* comm, int ctx, uint32_t counter) {
  ncclGin net(*comm, ctx);
  net.resetCounter(counter);
}

#if NCCL_VERSION_CODE >= 23200
#define FLOWDSL_GIN_GET_FUNCS(K)                                                                       \
  FLOWDSL_API void flowdsl_gin_get__##K(                                                              \
      uint32_t coop, const ncclDevComm* comm, int ctx, int team_nranks, int team_rank, int team_stride,  \
      int peer, ncclWindow_t remote, size_t remote_offset, ncclWindow_t local, size_t local_offset,      \
      size_t bytes) {                                                                                 \
    ncclGin net(*comm, ctx);                                                                          \
    net.get(make_team(team_nranks, team_rank, team_stride), peer, remote, remote_offset, local,       \
            local_offset, bytes, coop_##K(coop));                                                     \
  }
FLOWDSL_FOR_EACH_COOP(FLOWDSL_GIN_GET_FUNCS)
#endif
