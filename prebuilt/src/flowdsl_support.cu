// flowdsl support library: extern "C" wrappers over NCCL's Device API templates.
//
// Only pointers and scalars cross this boundary (no structs by value), so that
// numba can declare every function with the C ABI. The prototypes come from
// include/flowdsl_support.h, generated from flowdsl/lowering/externs.py; the
// compiler checks each definition below against it. Built to LTO-IR per
// (NCCL device ABI, arch) and inlined into user kernels by nvJitLink.
// The GIN functions are a library of their own (flowdsl_gin.cu), built once per
// GIN backend and linked only into kernels that use GIN.
#include "flowdsl_support.h"
#include "flowdsl_internal.cuh"

// The first wait to give up claims the record (the stop word, 0 -> 2) and fills it; an
// abort (1) or an earlier timeout leaves it as it is. The record is mapped host memory, which
// takes no system-scope atomics over PCIe (compute-sanitizer: "invalid system-scoped atomic");
// only this GPU's threads race for it, so a GPU-scope CAS decides, and the host's plain store
// of an abort (1) against it leaves the word non-zero either way.
// The record names no rank: the host reports its communicator's own.
__device__ __noinline__ void flowdsl_detail::record_timeout(uint64_t* rec, int what, int peer, uint32_t index,
                                                           uint64_t expected, uint64_t seen, uint64_t waited_ns) {
  uint64_t old;
  asm volatile("atom.relaxed.gpu.cas.b64 %0, [%1], %2, %3;" : "=l"(old) : "l"(rec + kStop), "l"(0ull), "l"(2ull)
               : "memory");
  if (old != 0) return;
  rec[kWhat] = (uint64_t)what;
  rec[kBlock] = blockIdx.x + (uint64_t)gridDim.x * (blockIdx.y + (uint64_t)gridDim.y * blockIdx.z);
  rec[kThread] = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  rec[kExpected] = expected;
  rec[kSeen] = seen;
  rec[kPeer] = (uint64_t)(int64_t)peer;
  rec[kIndex] = index;
  rec[kWaitedNs] = waited_ns;
  asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(rec + kDone), "l"(1ull) : "memory");
}

// state: the wait's start time (ns, low bits cleared) | spins since the last check.
// record: the device communicator's wait record (its last word), so a caller keeps that one word of the
// communicator live, not its struct.
FLOWDSL_API uint64_t flowdsl_wait_check(void* record, uint64_t state, int what, int peer, uint32_t index,
                                        uint64_t expected, uint64_t seen) {
  uint64_t* rec = static_cast<uint64_t*>(record);
  if (rec == nullptr) return state;
  uint64_t now = global_timer() & ~kSpinMask;
  uint64_t start = state & ~kSpinMask;
  if (start == 0) return now | (state & kSpinMask);  // the first check: the wait starts now
  if (load_relaxed_sys(rec + kStop) != 0) return kGaveUp;
  uint64_t timeout = load_relaxed_sys(rec + kTimeoutNs);
  if (timeout == 0 || now - start < timeout) return state;
  record_timeout(rec, what, peer, index, expected, seen, now - start);
  return kGaveUp;
}

// ---- device communicator fields -------------------------------------------
FLOWDSL_API int flowdsl_comm_rank(const ncclDevComm* comm) { return comm->rank; }
FLOWDSL_API int flowdsl_comm_nranks(const ncclDevComm* comm) { return comm->nRanks; }
FLOWDSL_API int flowdsl_comm_lsa_rank(const ncclDevComm* comm) { return comm->lsaRank; }
FLOWDSL_API int flowdsl_comm_lsa_size(const ncclDevComm* comm) { return comm->lsaSize; }
FLOWDSL_API int flowdsl_comm_gin_context_count(const ncclDevComm* comm) { return comm->ginContextCount; }

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

// A device communicator made without lsaMultimem has no multicast base: null, which the caller reports
// (flowdsl/lowering/lsa.py) in the simulator's words.
FLOWDSL_API void* flowdsl_get_lsa_multimem_pointer(ncclWindow_t win, size_t offset, const ncclDevComm* comm) {
  return comm->lsaMultimem.mcBasePtr == nullptr ? nullptr : ncclGetLsaMultimemPointer(win, offset, *comm);
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
