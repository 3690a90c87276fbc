// flowdsl support library, GIN part: extern "C" wrappers over NCCL's ncclGin.
//
// Built apart from flowdsl_support.cu, once per GIN backend: NCCL dispatches every GIN
// operation over the backends its headers enable (NCCL_GIN_<BACKEND>_ENABLE, which the
// build sets to 0 for all but one), and LTO of that dispatch for every backend is most of
// a GIN kernel's compile time. The build with every backend ("gin", NCCL's default) serves
// kernels compiled before their device communicator is known; see
// flowdsl/runtime/support.py. Prototypes come from include/flowdsl_gin.h, generated from
// flowdsl/lowering/externs.py.
#include "flowdsl_support.h"
#include "flowdsl_gin.h"
#include "flowdsl_internal.cuh"

namespace {

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

// ncclGinBarrierSession::sync with every spin bounded: the same signals, orders, scopes, fence
// levels and barrier state as NCCL's. NCCL 2.28 counts one signal per barrier in an epoch and has
// fence level None only (flowdsl's typing refuses the others there); from 2.29 each peer has a
// signal and the arrivals are counted in its shadow; 2.31 sends every signal before the first
// wait; 2.32's Put level flushes first where signals are weak and arrives at this rank too (its
// puts to itself), its Get level flushes after the waits. One form only: NCCL >= 2.30.3 has a
// timeout form of its own too, but it counts SM cycles without watching the stop word, and a
// second form would double the barrier's compile time.
template <typename Coop>
__device__ __forceinline__ void bounded_gin_barrier_sync(ncclGinBarrierSession<Coop>& s, const ncclDevComm* comm,
                                                         cuda::memory_order ord, uint32_t fence, int what,
                                                         uint32_t index) {
  auto scope = nccl::utility::releaseOrderOf(ord) != cuda::memory_order_relaxed ? cuda::thread_scope_thread
                                                                                 : cuda::thread_scope_system;
  auto peer_at = [&](int i) {  // peers in rotation from this rank (spreads the load, as NCCL does)
    int peer = 1 + s.team.rank + i;
    return s.team.nRanks <= peer ? peer - s.team.nRanks : peer;
  };
  s.coop.sync();
#if NCCL_VERSION_CODE >= 23200
  bool put = fence & (uint32_t)ncclGinFenceLevel::Put;
  if (put && !s.net._supportsStrongSignal()) s.net.flush(s.coop, nccl::utility::acquireOrderOf(ord));
  int arrivals = put ? s.team.nRanks : s.team.nRanks - 1;  // the last, with Put, is this rank's own
#else
  int arrivals = s.team.nRanks - 1;
#endif
#if NCCL_VERSION_CODE >= 22900
  auto signal_peer = [&](int peer) {
    s.net.signal(s.team, peer, ncclGin_SignalInc{s.signal + s.team.rank}, ncclCoopThread(), ncclGin_None(), scope);
  };
  // After a wait gave up, the shadows still count every arrival this barrier expects (as after
  // NCCL's abort, whose waits return at once).
  bool gave_up = false;
  auto wait_peer = [&](int peer) {
    uint32_t* shadow = (uint32_t*)s.net.getSignalShadowPtr(s.signal + peer);
    uint32_t need = ++*shadow;
    uint64_t state = 0;
#pragma unroll 1
    while (!gave_up) {
      uint64_t got = s.net.readSignal(s.signal + peer, 32, nccl::utility::acquireOrderOf(ord));
      if (nccl::utility::rollingLessEq((uint64_t)need, got, 32)) break;
      gave_up = !keep_waiting(comm, state, what, ncclTeamRankToWorld(*comm, s.team, peer), index, need, got);
    }
  };
#if NCCL_VERSION_CODE >= 23100
#pragma unroll 1
  for (int i = s.coop.thread_rank(); i < arrivals; i += s.coop.size()) signal_peer(peer_at(i));
#pragma unroll 1
  for (int i = s.coop.thread_rank(); i < arrivals; i += s.coop.size()) wait_peer(peer_at(i));
#else
#pragma unroll 1
  for (int i = s.coop.thread_rank(); i < arrivals; i += s.coop.size()) {
    signal_peer(peer_at(i));
    wait_peer(peer_at(i));
  }
#endif
#else
#pragma unroll 1
  for (int i = s.coop.thread_rank(); i < s.team.nRanks - 1; i += s.coop.size()) {
    s.net.signal(s.team, peer_at(i), ncclGin_SignalInc{s.signal}, ncclCoopThread(), ncclGin_None(), scope);
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
#if NCCL_VERSION_CODE >= 23200
  if (fence & (uint32_t)ncclGinFenceLevel::Get) {  // this rank's gets have landed (after the waits, as NCCL)
    s.coop.sync();
    s.net.flush(s.coop, nccl::utility::acquireOrderOf(ord));
  }
#endif
  s.coop.sync();
}

// ncclBarrierSession::sync on the world team with flowdsl's Relaxed fence, as every release runs
// it: the LSA team's barrier (releasing), then the rail team's GIN barrier (acquiring), each
// bounded. The two sessions are those NCCL's world session opens (2.30 gave them handles of their
// own), opened here directly: ncclBarrierSession's optional members make a third more LTO-IR.
__device__ __forceinline__ ncclLsaBarrierHandle hybrid_lsa_handle(const ncclDevComm* comm) {
#if NCCL_VERSION_CODE >= 23000
  return comm->hybridLsaBarrier;
#else
  return comm->lsaBarrier;
#endif
}
__device__ __forceinline__ ncclGinBarrierHandle hybrid_rail_handle(const ncclDevComm* comm) {
#if NCCL_VERSION_CODE >= 23000
  return comm->hybridRailGinBarrier;
#else
  return comm->railGinBarrier;
#endif
}

// The world session's two parts, each on its own: ncclBarrierSession::lsaBarrier() and ::ginBarrier() return
// references to them, so a sub-session's sync moves the epoch the whole session's next sync starts from.
template <typename Coop>
__device__ __forceinline__ void bounded_hybrid_lsa_sync(Coop c, const ncclDevComm* comm, uint32_t index,
                                                        cuda::memory_order ord) {
  ncclLsaBarrierSession<Coop> lsa{c, *comm, ncclTeamLsa(*comm), hybrid_lsa_handle(comm), index, false,
                                  comm->lsaMultimem};
  lsa.arrive(c, ord);
  bounded_lsa_wait(lsa, comm, ord);
}
template <typename Coop>
__device__ __forceinline__ void bounded_hybrid_rail_sync(Coop c, const ncclDevComm* comm, int ctx, uint32_t index,
                                                         cuda::memory_order ord, uint32_t fence) {
  ncclGinBarrierSession<Coop> rail{c, ncclGin(*comm, ctx), ncclTeamRail(*comm), hybrid_rail_handle(comm), index};
  bounded_gin_barrier_sync(rail, comm, ord, fence, kHybridBarrier, index);
}

// NCCL 2.32 picks the session's barriers by fence level: with Put, where GIN reaches ranks outside the rail
// team, the rail barrier's arrivals would not follow the puts to those ranks, so a GIN barrier over every
// GIN-connected rank (its dense barrier) replaces it, after the LSA barrier unless GIN reaches every rank.
// (NCCL keeps the rail barrier on backends whose any signal flushes every put, after a flush: the same
// guarantee; flowdsl takes the dense barrier there too.)
template <typename Coop>
__device__ __forceinline__ void bounded_hybrid_barrier_sync(Coop c, const ncclDevComm* comm, int ctx, uint32_t index,
                                                            cuda::memory_order ord, uint32_t fence) {
#if NCCL_VERSION_CODE >= 23200
  int stride = comm->ginContextStride;
  if ((fence & (uint32_t)ncclGinFenceLevel::Put) && stride != ncclTeamRail(*comm).stride) {
    if (stride != 1) bounded_hybrid_lsa_sync(c, comm, index, nccl::utility::releaseOrderOf(ord));
    ncclGinBarrierSession<Coop> dense{c, ncclGin(*comm, ctx), ncclTeam{comm->nRanks / stride, comm->rank / stride, stride},
                                      comm->hybridDenseGinBarrier, index};
    bounded_gin_barrier_sync(dense, comm, stride != 1 ? nccl::utility::acquireOrderOf(ord) : ord, fence,
                             kHybridBarrier, index);
    return;
  }
#endif
  bounded_hybrid_lsa_sync(c, comm, index, nccl::utility::releaseOrderOf(ord));
  bounded_hybrid_rail_sync(c, comm, ctx, index, nccl::utility::acquireOrderOf(ord), fence);
}

// put, putValue and signal take the coop kind (flowdsl.enums.CoopKind) and word at run time.
// NCCL's forms of them sync the coop, issue the operation from the coop's thread 0 with
// ncclCoopThread, and sync again (impl/gin__funcs.h); these wrappers do the same around the
// ncclCoopThread form, so one function serves every coop. After LTO inlining the kind is a
// constant and the switch folds: the code is that of NCCL's form for that coop.
__device__ __forceinline__ void coop_sync(int kind, uint32_t w) {
  switch (kind) {
    case 1: coop_warp(w).sync(); break;
    case 2: coop_lanes(w).sync(); break;
    case 3: coop_warp_span(w).sync(); break;
    case 4: coop_cta(w).sync(); break;
    default: coop_thread(w).sync(); break;
  }
}
__device__ __forceinline__ bool coop_leader(int kind, uint32_t w) {
  switch (kind) {
    case 1: return coop_warp(w).thread_rank() == 0;
    case 2: return coop_lanes(w).thread_rank() == 0;
    case 3: return coop_warp_span(w).thread_rank() == 0;
    case 4: return coop_cta(w).thread_rank() == 0;
    default: return true;
  }
}

}  // namespace

// ---- put, putValue, signal ----------------------------------------------------------
// One C function per remote action (and, for put, counted or not; for putValue, payload
// size): each is one instantiation of NCCL's template, so a kernel compiles only the kinds
// it uses. Remote actions read their operands from the common parameters (signal,
// signal_win, signal_offset, value); unused ones are zero.
#if NCCL_VERSION_CODE >= 23200
using LocalCounter = ncclGin_WeakCounterInc;
#define FLOWDSL_FOR_EACH_REMOTE_2_32(X)                                   \
  X(strong_signal_inc, ncclGin_StrongSignalInc{signal})                 \
  X(weak_signal_inc, ncclGin_WeakSignalInc{signal})                     \
  X(strong_signal_add, (ncclGin_StrongSignalAdd{signal, value}))        \
  X(weak_signal_add, (ncclGin_WeakSignalAdd{signal, value}))            \
  X(strong_va_signal_inc, (ncclGin_StrongVASignalInc{signal_win, signal_offset}))        \
  X(weak_va_signal_inc, (ncclGin_WeakVASignalInc{signal_win, signal_offset}))            \
  X(strong_va_signal_add, (ncclGin_StrongVASignalAdd{signal_win, signal_offset, value})) \
  X(weak_va_signal_add, (ncclGin_WeakVASignalAdd{signal_win, signal_offset, value}))
#else
using LocalCounter = ncclGin_CounterInc;
#define FLOWDSL_FOR_EACH_REMOTE_2_32(X)
#endif
#define FLOWDSL_FOR_EACH_SIGNAL(X)                                        \
  X(signal_inc, ncclGin_SignalInc{signal})                              \
  X(signal_add, (ncclGin_SignalAdd{signal, value}))                     \
  FLOWDSL_FOR_EACH_REMOTE_2_32(X)
#define FLOWDSL_FOR_EACH_REMOTE(X) X(none, ncclGin_None{}) FLOWDSL_FOR_EACH_SIGNAL(X)

#define FLOWDSL_GIN_PARAMS_TO_PEER                                                                    \
  int coop_kind, uint32_t coop, const ncclDevComm* comm, int ctx, int team_nranks, int team_rank,     \
      int team_stride, int peer
#define FLOWDSL_GIN_PARAMS_REMOTE \
  uint32_t signal, ncclWindow_t signal_win, size_t signal_offset, uint64_t value
// The coop syncs, its thread 0 issues OP on the context, the coop syncs (as NCCL's forms do).
#define FLOWDSL_GIN_BY_LEADER(OP)                                                                     \
  coop_sync(coop_kind, coop);                                                                         \
  if (coop_leader(coop_kind, coop)) ncclGin(*comm, ctx).OP;                                           \
  coop_sync(coop_kind, coop);

#define FLOWDSL_GIN_PUT(R, ACTION)                                                                    \
  FLOWDSL_API void flowdsl_gin_put__##R(FLOWDSL_GIN_PARAMS_TO_PEER, ncclWindow_t dst, size_t dst_offset, \
      ncclWindow_t src, size_t src_offset, size_t bytes, FLOWDSL_GIN_PARAMS_REMOTE) {                 \
    FLOWDSL_GIN_BY_LEADER(put(make_team(team_nranks, team_rank, team_stride), peer, dst, dst_offset, src, \
                              src_offset, bytes, ACTION, ncclGin_None{}, ncclCoopThread()))           \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_put__##R##__counted(FLOWDSL_GIN_PARAMS_TO_PEER, ncclWindow_t dst,       \
      size_t dst_offset, ncclWindow_t src, size_t src_offset, size_t bytes, FLOWDSL_GIN_PARAMS_REMOTE,   \
      uint32_t counter) {                                                                             \
    FLOWDSL_GIN_BY_LEADER(put(make_team(team_nranks, team_rank, team_stride), peer, dst, dst_offset, src, \
                              src_offset, bytes, ACTION, LocalCounter{counter}, ncclCoopThread()))    \
  }
#define FLOWDSL_GIN_PUT_VALUE_OF(R, ACTION, SIZE, T)                                                  \
  FLOWDSL_API void flowdsl_gin_put_value__##R##__##SIZE(FLOWDSL_GIN_PARAMS_TO_PEER, ncclWindow_t dst,  \
      size_t dst_offset, uint64_t payload, FLOWDSL_GIN_PARAMS_REMOTE) {                               \
    FLOWDSL_GIN_BY_LEADER(putValue(make_team(team_nranks, team_rank, team_stride), peer, dst, dst_offset, \
                                   (T)payload, ACTION, ncclCoopThread()))                             \
  }
#define FLOWDSL_GIN_PUT_VALUE(R, ACTION)                                                              \
  FLOWDSL_GIN_PUT_VALUE_OF(R, ACTION, u8, uint8_t)                                                    \
  FLOWDSL_GIN_PUT_VALUE_OF(R, ACTION, u16, uint16_t)                                                  \
  FLOWDSL_GIN_PUT_VALUE_OF(R, ACTION, u32, uint32_t)                                                  \
  FLOWDSL_GIN_PUT_VALUE_OF(R, ACTION, u64, uint64_t)
#define FLOWDSL_GIN_SIGNAL(R, ACTION)                                                                 \
  FLOWDSL_API void flowdsl_gin_signal__##R(FLOWDSL_GIN_PARAMS_TO_PEER, FLOWDSL_GIN_PARAMS_REMOTE) {   \
    FLOWDSL_GIN_BY_LEADER(signal(make_team(team_nranks, team_rank, team_stride), peer, ACTION,        \
                                 ncclCoopThread()))                                                   \
  }
FLOWDSL_FOR_EACH_REMOTE(FLOWDSL_GIN_PUT)
FLOWDSL_FOR_EACH_REMOTE(FLOWDSL_GIN_PUT_VALUE)
FLOWDSL_FOR_EACH_SIGNAL(FLOWDSL_GIN_SIGNAL)

// A GIN barrier session on a built-in team (NCCL's ncclTeamTag<Team>), synced with flowdsl's bounded wait;
// `what` is its wait-record code.
#define FLOWDSL_GIN_TEAM_BARRIER(K, team, Tag, what)                                                  \
  FLOWDSL_API void flowdsl_gin_##team##_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx, \
                                                          uint32_t index, int order, uint32_t fence) { \
    auto c = coop_##K(coop);                                                                          \
    ncclGinBarrierSession<decltype(c)> s{c, ncclGin(*comm, ctx), Tag(), index};                      \
    bounded_gin_barrier_sync(s, comm, (cuda::memory_order)order, fence, what, index);                 \
  }
#define FLOWDSL_GIN_BARRIERS(K)                                                                       \
  FLOWDSL_GIN_TEAM_BARRIER(K, rail, ncclTeamTagRail, kGinBarrier)                                     \
  FLOWDSL_API void flowdsl_hybrid_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,  \
                                                    uint32_t index, int order, uint32_t fence) {      \
    bounded_hybrid_barrier_sync(coop_##K(coop), comm, ctx, index, (cuda::memory_order)order, fence);  \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_hybrid_lsa_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx, \
                                                        uint32_t index, int order) {                  \
    bounded_hybrid_lsa_sync(coop_##K(coop), comm, index, (cuda::memory_order)order);                  \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_hybrid_gin_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx, \
                                                        uint32_t index, int order, uint32_t fence) {  \
    bounded_hybrid_rail_sync(coop_##K(coop), comm, ctx, index, (cuda::memory_order)order, fence);     \
  }
// Signals and counters are waited for, read and reset alike (ncclGin's *Signal and *Counter).
#define FLOWDSL_GIN_WAIT(K, kind, Counter, what)                                                      \
  FLOWDSL_API void flowdsl_gin_wait_##kind##__##K(uint32_t coop, const ncclDevComm* comm, int ctx, uint32_t id, \
                                                 uint64_t least, int bits, int order) {               \
    bounded_gin_wait<Counter>(coop_##K(coop), comm, ncclGin(*comm, ctx), id, least, bits,             \
                              (cuda::memory_order)order, what, id);                                   \
  }
#define FLOWDSL_GIN_COOP_FUNCS(K)                                                                      \
  FLOWDSL_API void flowdsl_gin_flush__##K(uint32_t coop, const ncclDevComm* comm, int ctx, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    net.flush(coop_##K(coop), (cuda::memory_order)order);                                             \
  }                                                                                                   \
  FLOWDSL_GIN_WAIT(K, signal, false, kGinSignal)                                                      \
  FLOWDSL_GIN_WAIT(K, counter, true, kGinCounter)                                                     \
  FLOWDSL_GIN_BARRIERS(K)
FLOWDSL_FOR_EACH_COOP(FLOWDSL_GIN_COOP_FUNCS)

#define FLOWDSL_GIN_READ_RESET(kind, Kind)                                                            \
  FLOWDSL_API uint64_t flowdsl_gin_read_##kind(const ncclDevComm* comm, int ctx, uint32_t id, int bits, int order) { \
    return ncclGin(*comm, ctx).read##Kind(id, bits, (cuda::memory_order)order);                       \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_reset_##kind(const ncclDevComm* comm, int ctx, uint32_t id) {           \
    ncclGin(*comm, ctx).reset##Kind(id);                                                              \
  }
FLOWDSL_GIN_READ_RESET(signal, Signal)
FLOWDSL_GIN_READ_RESET(counter, Counter)

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

#if NCCL_VERSION_CODE >= 23000
// The world team's GIN barrier (NCCL 2.30's worldGinBarrier): the same bounded sync over every rank.
// Its wait-record code, flowdsl.wait.WORLD_GIN_BARRIER, is the one the other codes of flowdsl_internal.cuh's
// enum leave free (defined here: the CFT library, built by another toolkit, shares that header).
constexpr int kWorldGinBarrier = 12;
#define FLOWDSL_GIN_WORLD_BARRIER(K) FLOWDSL_GIN_TEAM_BARRIER(K, world, ncclTeamTagWorld, kWorldGinBarrier)
FLOWDSL_FOR_EACH_COOP(FLOWDSL_GIN_WORLD_BARRIER)
#endif
