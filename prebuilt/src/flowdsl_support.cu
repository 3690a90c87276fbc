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
    s.wait(c, (cuda::memory_order)order);                                                     \
  }                                                                                           \
  FLOWDSL_API void flowdsl_lsa_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm,     \
                                                 uint32_t index, int order) {                \
    auto c = coop_##K(coop);                                                                  \
    ncclLsaBarrierSession<decltype(c)> s{c, *comm, ncclTeamTagLsa(), index};                 \
    s.sync(c, (cuda::memory_order)order);                                                     \
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

#define FLOWDSL_GIN_COOP_FUNCS(K)                                                                      \
  FLOWDSL_API void flowdsl_gin_flush__##K(uint32_t coop, const ncclDevComm* comm, int ctx, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    net.flush(coop_##K(coop), (cuda::memory_order)order);                                             \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_wait_signal__##K(uint32_t coop, const ncclDevComm* comm, int ctx,      \
                                                uint32_t signal, uint64_t least, int bits, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    net.waitSignal(coop_##K(coop), signal, least, bits, (cuda::memory_order)order);                   \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_wait_counter__##K(uint32_t coop, const ncclDevComm* comm, int ctx,     \
                                                 uint32_t counter, uint64_t least, int bits, int order) { \
    ncclGin net(*comm, ctx);                                                                          \
    net.waitCounter(coop_##K(coop), counter, least, bits, (cuda::memory_order)order);                 \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_gin_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,     \
                                                 uint32_t index, int order) {                         \
    ncclGin net(*comm, ctx);                                                                          \
    auto c = coop_##K(coop);                                                                          \
    ncclGinBarrierSession<decltype(c)> s{c, net, ncclTeamTagRail(), index};                          \
    s.sync(c, (cuda::memory_order)order, ncclGinFenceLevel::Relaxed);                                 \
  }                                                                                                   \
  FLOWDSL_API void flowdsl_hybrid_barrier_sync__##K(uint32_t coop, const ncclDevComm* comm, int ctx,  \
                                                    uint32_t index, int order) {                      \
    ncclGin net(*comm, ctx);                                                                          \
    auto c = coop_##K(coop);                                                                          \
    ncclBarrierSession<decltype(c)> s{c, ncclTeamTagWorld(), net, index};                            \
    s.sync(c, (cuda::memory_order)order, ncclGinFenceLevel::Relaxed);                                 \
  }
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
