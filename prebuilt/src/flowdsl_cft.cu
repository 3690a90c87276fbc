// flowdsl CFT support library: extern "C" wrappers over NCCL's CFT device API.
//
// Built apart from flowdsl_support.cu: NCCL's headers compile CFT only for
// sm_100+ with CUDA >= 13.3, and LTO-IR of CUDA 13.3 cannot be read by an older
// nvJitLink, so the CUDA 13.0 builds stay as they are and this library is
// linked only into kernels that use flowdsl.cft. Prototypes come from
// include/flowdsl_cft.h, generated from flowdsl/lowering/externs.py; the coop and team
// helpers from flowdsl_internal.cuh, shared with the support library.
#include <new>

#include "flowdsl_support.h"
#include "flowdsl_cft.h"
#include "flowdsl_internal.cuh"

#if NCCL_VERSION_CODE >= 23100

namespace {

// A session lives in 32 bytes of shared memory that the kernel provides: the
// mbarrier NCCL's ncclCft drives, and the two words of ncclCft's own state
// (bytes announced to the mbarrier, phase parity). Keeping the state there
// lets one session span many C calls without a C++ object crossing the ABI.
struct Session {
  ncclCftSmem smem;
  uint32_t tx_count;
  uint32_t phase_parity;
};
static_assert(sizeof(Session) == 32, "flowdsl.cft.SESSION_BYTES");

// ncclCft<Coop> adds no data members to ncclCft_internal<Coop>, so a state
// loaded from shared memory is used as the session without re-running the
// constructor (which would re-initialise the mbarrier). Every call starts with
// a coop sync, so the state a previous call stored is visible to all threads.
template <typename Coop>
struct Bound {
  Session* s;
  ncclCft_internal<Coop> state;
  __device__ __forceinline__ Bound(Coop c, void* p)
      : s(static_cast<Session*>(p)),
        state{(c.sync(), c), static_cast<Session*>(p)->smem, static_cast<Session*>(p)->tx_count,
              static_cast<Session*>(p)->phase_parity} {}
  __device__ __forceinline__ ncclCft<Coop>& cft() { return static_cast<ncclCft<Coop>&>(state); }
  // op(cft()) for a call that counts bytes (put, putCounted, get, submit): only the thread NCCL
  // elects changes txCount, and that thread stores it back.
  template <typename Op>
  __device__ __forceinline__ void count_tx(Op op) {
    uint32_t before = state.txCount;
    op(cft());
    if (state.txCount != before) s->tx_count = state.txCount;
  }
};

// ncclCft::waitCounted with its spin bounded: the elected thread waits (relaxed loads) until the
// counter reaches expected, then the coop syncs and fences fabric -> consumer (as NCCL >= 2.32).
template <typename Coop>
__device__ __forceinline__ void bounded_cft_wait_counted(Coop coop, const ncclDevComm* comm, cuda::memory_order order,
                                                         ncclMemProxyType consumer, uint64_t* counter,
                                                         uint64_t expected, uint32_t index) {
  if (nccl::cft::internal::elected(coop)) {
    cuda::atomic_ref<uint64_t> inbox(*counter);
    uint64_t state = 0;
#pragma unroll 1
    while (true) {
      uint64_t got = inbox.load(cuda::memory_order_relaxed);
      if (got - expected <= uint64_t(-1) >> 1) break;
      if (!keep_waiting(comm, state, kCftCounter, -1, index, expected, got)) break;
    }
  }
  coop.sync();
  ncclMemFence(coop, nccl::utility::acquireOrderOf(order), ncclMemProxyType::Fabric, consumer,
               ncclMemFenceScope::Sys);
}

// ncclCftBarrierSession::wait with every spin bounded (the same relaxed loads, epoch update and
// closing fence as NCCL's). A thread whose wait gives up leaves the epoch as it was, as one
// that sees NCCL's abort flag does.
template <typename Coop>
__device__ __forceinline__ void bounded_cft_barrier_wait(ncclCftBarrierSession<Coop>& s, const ncclDevComm* comm,
                                                         cuda::memory_order order, ncclMemProxyType producer,
                                                         ncclMemProxyType consumer) {
  bool arrived = true;
  if (s.useMultimem()) {
    if (s.coop.thread_rank() == 0) {
      cuda::atomic_ref<uint32_t> inbox(*s.mcInbox());
      uint32_t need = s.epoch + s.team.nRanks;
      uint64_t state = 0;
#pragma unroll 1
      while (true) {
        uint32_t got = inbox.load(cuda::memory_order_relaxed);
        if (got - need <= uint32_t(-1) >> 1) break;
        if (!(arrived = keep_waiting(comm, state, kCftBarrier, -1, s.index, need, got))) break;
      }
      if (arrived) s.epoch = need;
    }
  } else {
    uint32_t need = s.epoch + 1;
#pragma unroll 1
    for (int i = s.coop.thread_rank(); i < s.team.nRanks - 1 && arrived; i += s.coop.size()) {
      int peer = i + (i < s.team.rank ? 0 : 1);
      cuda::atomic_ref<uint32_t> inbox(*s.ucInbox(peer));
      uint64_t state = 0;
#pragma unroll 1
      while (true) {
        uint32_t got = inbox.load(cuda::memory_order_relaxed);
        if (got - need <= uint32_t(-1) >> 1) break;
        int world_peer = ncclTeamRankToWorld(*comm, s.team, peer);
        if (!(arrived = keep_waiting(comm, state, kCftBarrier, world_peer, s.index, need, got))) break;
      }
    }
    if (arrived) s.epoch = need;
  }
  s.coop.sync();
  ncclMemFence(s.coop, nccl::utility::acquireOrderOf(order), producer, consumer, ncclMemFenceScope::Sys);
}

// As the LSA barrier wrappers: each call opens a session (loading the barrier's epoch) and
// closes it (storing it back), so later calls continue the sequence. NCCL's arrive, flowdsl's wait.
template <typename Coop>
__device__ __forceinline__ void cft_barrier(Coop c, const ncclDevComm* comm, uint32_t index, int order, int producer,
                                            int consumer, bool arrive, bool wait) {
  ncclCftBarrierSession<Coop> s{c, *comm, index};
  auto ord = (cuda::memory_order)order;
  if (arrive) s.arrive(c, ord, (ncclMemProxyType)producer, (ncclMemProxyType)consumer);
  if (wait) bounded_cft_barrier_wait(s, comm, ord, (ncclMemProxyType)producer, (ncclMemProxyType)consumer);
}

}  // namespace

// ---- teams and logical endpoints -------------------------------------------------
FLOWDSL_API void flowdsl_cft_team(const ncclDevComm* comm, int mode, int* out) {
  store_team(ncclTeamCft(*comm, (ncclCftTeamMode_t)mode), out);
}
FLOWDSL_API void flowdsl_cft_le_info(const ncclDevComm* comm, ncclWindow_t win, size_t offset, int team_nranks,
                                     int team_rank, int team_stride, int peer, uint64_t* out) {
  ncclCftLeId id;
  size_t le_offset;
  ncclGetCftLeInfo(win, offset, peer, make_team(team_nranks, team_rank, team_stride), *comm, &id, &le_offset);
  out[0] = id;
  out[1] = le_offset;
}
FLOWDSL_API void flowdsl_cft_peer_le_info(const ncclDevComm* comm, ncclWindow_t win, size_t offset, int peer,
                                          uint64_t* out) {
  ncclCftLeId id;
  size_t le_offset;
  ncclGetPeerLeInfo(win, offset, peer, *comm, &id, &le_offset);
  out[0] = id;
  out[1] = le_offset;
}

// ---- sessions -------------------------------------------------------------------------
#define FLOWDSL_CFT_SESSION_FUNCS(K)                                                                    \
  FLOWDSL_API void flowdsl_cft_session_open__##K(uint32_t coop, void* session) {                       \
    auto c = coop_##K(coop);                                                                            \
    Session* s = static_cast<Session*>(session);                                                        \
    /* Constructed in place and never destroyed here: close() runs the destructor. */                  \
    alignas(ncclCft<decltype(c)>) unsigned char storage[sizeof(ncclCft<decltype(c)>)];                 \
    auto* cft = new (storage) ncclCft<decltype(c)>(c, s->smem);                                        \
    if (c.thread_rank() == 0) {                                                                         \
      s->tx_count = cft->txCount;                                                                       \
      s->phase_parity = cft->phaseParity;                                                               \
    }                                                                                                   \
    c.sync();                                                                                           \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_session_close__##K(uint32_t coop, void* session) {                      \
    Bound<decltype(coop_##K(coop))> b(coop_##K(coop), session);                                        \
    b.cft().~ncclCft();                                                                                 \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_put__##K(uint32_t coop, void* session, uint32_t le_id, size_t le_offset, \
                                        void* src, uint32_t bytes) {                                    \
    auto c = coop_##K(coop);                                                                            \
    Bound<decltype(c)>(c, session).count_tx([&](auto& cft) { cft.put(c, le_id, le_offset, src, bytes); }); \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_get__##K(uint32_t coop, void* session, uint32_t le_id, size_t le_offset, \
                                        void* dst, uint32_t bytes) {                                    \
    auto c = coop_##K(coop);                                                                            \
    Bound<decltype(c)>(c, session).count_tx([&](auto& cft) { cft.get(c, le_id, le_offset, dst, bytes); }); \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_submit__##K(uint32_t coop, void* session) {                             \
    auto c = coop_##K(coop);                                                                            \
    Bound<decltype(c)>(c, session).count_tx([&](auto& cft) { cft.submit(c); });                         \
  }                                                                                                     \
  FLOWDSL_API uint32_t flowdsl_cft_flush__##K(uint32_t coop, void* session) {                          \
    auto c = coop_##K(coop);                                                                            \
    Bound<decltype(c)> b(c, session);                                                                   \
    bool has_report = false;                                                                            \
    uint32_t report = 0;                                                                                \
    b.cft().flush(c, &has_report, &report);                                                             \
    /* Every thread flipped its parity; one stores it (read again after the next call's sync). */       \
    if (c.thread_rank() == 0) b.s->phase_parity = b.state.phaseParity;                                  \
    return has_report ? (0x100u | report) : 0u;                                                        \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_flush_smem__##K(uint32_t coop, void* session) {                         \
    auto c = coop_##K(coop);                                                                            \
    Bound<decltype(c)> b(c, session);                                                                   \
    b.cft().flushSmem(c);                                                                               \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_mem_fence__##K(uint32_t coop, int order, int producer, int consumer,    \
                                              int scope) {                                              \
    ncclMemFence(coop_##K(coop), (cuda::memory_order)order, (ncclMemProxyType)producer,                 \
                 (ncclMemProxyType)consumer, (ncclMemFenceScope)scope);                                 \
  }
FLOWDSL_FOR_EACH_COOP(FLOWDSL_CFT_SESSION_FUNCS)

// Counted writes and their waits came with NCCL 2.32 (2.31 has CFT sessions without them).
#if NCCL_VERSION_CODE >= 23200
#define FLOWDSL_CFT_COUNTED_FUNCS(K)                                                                       \
  FLOWDSL_API void flowdsl_cft_put_counted__##K(uint32_t coop, void* session, uint32_t le_id,          \
                                                size_t le_offset, size_t counter_offset, void* src,     \
                                                uint32_t bytes) {                                       \
    auto c = coop_##K(coop);                                                                            \
    Bound<decltype(c)>(c, session).count_tx(                                                            \
        [&](auto& cft) { cft.putCounted(c, le_id, le_offset, counter_offset, src, bytes); });          \
  }                                                                                                     \
  FLOWDSL_API void flowdsl_cft_wait_counted__##K(uint32_t coop, const ncclDevComm* comm, void* session, \
                                                 ncclWindow_t win, size_t offset, uint64_t expected,    \
                                                 int order, int consumer) {                             \
    auto c = coop_##K(coop);                                                                            \
    c.sync(); /* as every session call starts (Bound) */                                                \
    bounded_cft_wait_counted(c, comm, (cuda::memory_order)order, (ncclMemProxyType)consumer,            \
                             (uint64_t*)ncclGetLocalPointer(win, offset), expected, (uint32_t)offset);  \
  }
FLOWDSL_FOR_EACH_COOP(FLOWDSL_CFT_COUNTED_FUNCS)
FLOWDSL_API uint64_t flowdsl_cft_read_counter(ncclWindow_t win, size_t offset, int order) {
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system> counter(*(uint64_t*)ncclGetLocalPointer(win, offset));
  return counter.load((cuda::memory_order)order);
}
#endif

// ---- CFT barrier sessions ----------------------------------------------------------------
#define FLOWDSL_CFT_BARRIER_FUNC(K, method, arrive, wait)                                           \
  FLOWDSL_API void flowdsl_cft_barrier_##method##__##K(uint32_t coop, const ncclDevComm* comm,      \
                                                       uint32_t index, int order, int producer,     \
                                                       int consumer) {                              \
    cft_barrier(coop_##K(coop), comm, index, order, producer, consumer, arrive, wait);               \
  }
#define FLOWDSL_CFT_BARRIER_FUNCS(K)                                                                \
  FLOWDSL_CFT_BARRIER_FUNC(K, arrive, true, false)                                                  \
  FLOWDSL_CFT_BARRIER_FUNC(K, wait, false, true)                                                    \
  FLOWDSL_CFT_BARRIER_FUNC(K, sync, true, true)
FLOWDSL_FOR_EACH_COOP(FLOWDSL_CFT_BARRIER_FUNCS)

#endif  // NCCL_VERSION_CODE >= 23100
