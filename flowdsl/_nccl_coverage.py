"""Which flowdsl name provides each public name of NCCL's device API, or why none does.

``docs/nccl_device_surface.txt`` lists NCCL's names (``scripts/nccl_device_surface.py`` generates it
from NCCL's headers). :data:`COVERAGE` maps each to a :class:`Provided`, the flowdsl name that does
the same (an attribute such as ``flowdsl.gin.put``, or a ``comm.device_communicator(keyword=...)``
that sets the same ``ncclDevCommRequirements`` field), or to a :class:`Refused`: not yet (saying
which work item would add it) or not applicable (saying why). tests/compile/test_nccl_coverage.py
fails while an entry of the list has neither, and while a flowdsl name does not resolve;
docs/nccl-coverage.md is this table rendered.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Provided", "Refused", "COVERAGE", "CATEGORIES", "PROVIDED", "NOT_YET", "NOT_APPLICABLE", "category",
           "device_communicator_keyword"]

PROVIDED = "provided"
NOT_YET = "not yet"
NOT_APPLICABLE = "not applicable"
CATEGORIES = (PROVIDED, NOT_YET, NOT_APPLICABLE)


@dataclass(frozen=True)
class Provided:
    """A flowdsl name that provides the NCCL name, and what differs, if anything."""

    name: str
    note: str = ""


@dataclass(frozen=True)
class Refused:
    """Why flowdsl offers no counterpart: ``category`` is :data:`NOT_YET` or :data:`NOT_APPLICABLE`."""

    category: str
    reason: str


def _keyword(name: str, note: str = "") -> Provided:
    return Provided(f"comm.device_communicator({name}=...)", note)


def device_communicator_keyword(name: str) -> str | None:
    """The keyword a ``comm.device_communicator(keyword=...)`` name stands for, or None for another name."""
    prefix = "comm.device_communicator("
    return name[len(prefix):].split("=", 1)[0] if name.startswith(prefix) else None


def _not_yet(reason: str) -> Refused:
    return Refused(NOT_YET, reason)


def _not_applicable(reason: str) -> Refused:
    return Refused(NOT_APPLICABLE, reason)


def _each(entries: str, outcome) -> dict:
    """``{entry: outcome}`` for each line of ``entries``."""
    return {entry.strip(): outcome for entry in entries.strip().splitlines()}


# ---- reasons shared by several names -----------------------------------------------------------------

MULTIMEM = _not_yet("multimem beyond the LSA team's windows (other teams' and resource buffers' multicast addresses, "
                    "multimem handles, CFT multimem, multimem barriers): not yet; lsa.multimem_view is the LSA "
                    "team's window through its multicast address")
#: The note of every multimem reduce/copy helper flowdsl has.
MULTIMEM_HELPER = ("over lsa.multimem_view views (the LSA team's windows; element counts); flowdsl's own code, "
                   "written in flowdsl (NCCL before 2.32 has no such helper)")
LL_A2A = _not_yet("LL all-to-all sessions (ncclLLA2ASession): not yet")
RESOURCE_BUFFERS = _not_yet("device resource buffers (resourceRequirementsList, ncclDevResourceHandle): not yet")
CUSTOM_TEAM_BARRIERS = _not_yet("barriers over other teams than the built-in ones (barrier handles from "
                                "ncclLsaBarrierCreateRequirement and friends, via resourceRequirementsList): not yet")
ALL_CONTEXTS = _not_yet("barriers fenced over every GIN context (ncclGinAllContexts): not yet")
GIN_REQUESTS = _not_yet("asynchronous GIN flush requests (flushAsync, wait on an ncclGinRequest_t): not yet")
SIGNAL_SHADOWS = _not_yet("GIN signal shadows: not yet")
DESCRIPTORS = _not_yet("shared-memory GIN descriptors (ncclGin_DescriptorSmem): not yet")
HOST_SEGMENTS = _not_yet("GIN puts and gets on host (HOST_NUMA) memory: not yet; windows are device memory")
OPT_FLAGS = _not_yet("GIN option flags: not yet; flowdsl's GIN operations pass ncclGinOptFlagsDefault")
SHARING_MODES = _not_yet("GIN resource sharing modes other than NCCL's default (GPU): not yet")
CUSTOM_ARRAY = _not_yet("GIN connections to a list of peers (ginCustomArray): not yet; gin_connection_type "
                        "CUSTOM_ARRAY is refused by name (FULL, RAIL and CUSTOM_STRIDE are offered)")
BACKEND_MASKS = _not_yet("GIN device code for a subset of backends: not yet; a kernel links one backend's build "
                         "(its device communicator's at launch, FlowKernel.compile(gin_backend=...)) or every "
                         "backend's")
CFT_OPERATIONS = _not_yet("CFT reductions (red, pullRed) and putCpMask: not yet")
REDUCE_COPY = _not_yet("NCCL's reduce/copy helpers over source and destination lambdas, other operators, "
                       "local memory or TMA: not yet; lsa.reduce_sum, lsa.copy and lsa.reduce_sum_copy cover "
                       "the LSA team's windows")
NCCL_FLOW = _not_applicable("NCCL's Flow API (experimental in NCCL: 'signatures are not stable') is not wrapped: "
                            "flowdsl.flow is flowdsl's own Flow, written in flowdsl with its own staging layout "
                            "and wire format (its protocols: flowdsl.Protocol)")
WINDOW_OFFSETS = ("flowdsl addresses symmetric memory as a window and an offset, as NCCL's window forms do; "
                  "there is no ncclSymPtr value")
INTEGER_ID = "an integer in flowdsl: its calls take and return ids as ints"
#: The note of every reduce/copy helper flowdsl has.
WRITTEN_IN_FLOWDSL = ("the LSA team's form over a window (element offsets); flowdsl's own code, written in "
                      "flowdsl (NCCL before 2.32 has no such helper)")
LEGACY_SIGNAL = ("NCCL's legacy kind (deprecated for the strong and weak forms): strong or weak as the backend "
                 "makes it")
VA_OVERLOAD = "the VA signal overload (window, offset) not yet: flowdsl kernels load a VA signal with flowdsl.mem"
TIMEOUTS = "its timeout overload: flowdsl's waits are bounded by the communicator's timeout instead (flowdsl.wait)"


COVERAGE: dict[str, Provided | Refused] = {
    # ---- ncclDevCommRequirements: comm.device_communicator(...) keywords --------------------------------
    "field ncclDevCommRequirements.barrierCount": _keyword("barrier_count", "hybrid barriers (gin.hybrid_barrier)"),
    "field ncclDevCommRequirements.lsaBarrierCount": _keyword("lsa_barrier_count"),
    "field ncclDevCommRequirements.railGinBarrierCount": _keyword("rail_gin_barrier_count"),
    "field ncclDevCommRequirements.ginContextCount": _keyword(
        "gin_context_count", "NCCL's hint: the count to use is the device communicator's, dc.gin_context_count on "
        "the host and comm.gin_context_count in kernels"),
    "field ncclDevCommRequirements.ginSignalCount": _keyword("gin_signal_count"),
    "field ncclDevCommRequirements.ginCounterCount": _keyword("gin_counter_count"),
    "field ncclDevCommRequirements.ginForceEnable": _keyword("gin_force_enable"),
    "field ncclDevCommRequirements.cftCaps": _keyword("cft_caps", "NCCL >= 2.31"),
    "field ncclDevCommRequirements.cftBarrierCount": _keyword("cft_barrier_count", "NCCL >= 2.31"),
    "field ncclDevCommRequirements.lsaMultimem": _keyword(
        "lsa_multimem", "refused on the host where the GPUs have no NVLink SHARP (on the simulator, unless "
        "flowdsl.sim.spawn(..., multimem=True))"),
    "field ncclDevCommRequirements.teamRequirementsList": _not_yet(
        "team requirements (multimem on other teams than the LSA team): not yet"),
    "field ncclDevCommRequirements.resourceRequirementsList": RESOURCE_BUFFERS,
    "field ncclDevCommRequirements.lsaLLA2ABlockCount": LL_A2A,
    "field ncclDevCommRequirements.lsaLLA2ASlotCount": LL_A2A,
    "field ncclDevCommRequirements.worldGinBarrierCount": _keyword(
        "world_gin_barrier_count", "not in NCCL 2.28; gin.world_barrier's count; refused with gin_connection_type "
        "RAIL, as NCCL refuses it"),
    "field ncclDevCommRequirements.ginConnectionType": _keyword(
        "gin_connection_type", "a flowdsl.GinConnectionType, not in NCCL 2.28; FULL by default when GIN resources are "
        "asked for (NCCL refuses them without GIN enabled)"),
    "field ncclDevCommRequirements.ginCustomStride": _keyword("gin_custom_stride", "not in NCCL 2.28"),
    "field ncclDevCommRequirements.ginCustomArray": CUSTOM_ARRAY,
    "field ncclDevCommRequirements.ginCustomArrayCount": CUSTOM_ARRAY,
    "field ncclDevCommRequirements.ginExclusiveContexts": _keyword("gin_exclusive_contexts", "not in NCCL 2.28"),
    "field ncclDevCommRequirements.ginQueueDepth": _keyword("gin_queue_depth", "not in NCCL 2.28"),
    "field ncclDevCommRequirements.ginTrafficClass": _keyword("gin_traffic_class", "not in NCCL 2.28"),
    "field ncclDevCommRequirements.ginStrongSignalsRequired": _keyword(
        "gin_strong_signals_required", "not in NCCL 2.28; as in NCCL, a backend without strong signals is passed "
        "over while they are required, and legacy signals are strong exactly where they are (the simulator refuses "
        "a strong signal where they are not)"),
    "field ncclDevCommRequirements.ginVaSignalsRequired": _keyword(
        "gin_va_signals_required", "not in NCCL 2.28; the simulator does not check that kernels honour it"),
    "field ncclDevCommRequirements.ginType": _keyword(
        "gin_type", "a flowdsl.GinBackend, or left out (NCCL picks); not in NCCL 2.28; a backend the communicator "
        "lacks is refused in NCCL's words"),
    "field ncclDevCommRequirements.useRuntimeVersion": _not_applicable(
        "flowdsl fills the requirements struct and sizes the device communicator by the loaded NCCL release's "
        "own layout (flowdsl/runtime/support.py), and its device code is built for that release"),

    # ---- the device communicator, teams and windows (core.h, comm.h) ------------------------------------
    "type ncclDevComm": Provided("flowdsl.DevComm", "comm.device_communicator(...) makes one; kernels take it"),
    "type ncclTeam": Provided("flowdsl.team", "a team is a value that flowdsl.team's functions make and take"),
    "function ncclTeamWorld": Provided("flowdsl.team.world"),
    "function ncclTeamLsa": Provided("flowdsl.team.lsa"),
    "function ncclTeamRail": Provided("flowdsl.team.rail"),
    "function ncclTeamRankToWorld": Provided("flowdsl.team.rank_to_world"),
    "function ncclTeamRankToLsa": Provided("flowdsl.team.rank_to_lsa"),
    "function ncclTeamRankIsMember": Provided("flowdsl.team.rank_is_member"),
    "function ncclTeamRankToTeam": Provided("flowdsl.team.rank_to_team"),
    "function ncclTeamInnerFactor": Provided("flowdsl.team.inner_factor"),
    "function ncclTeamOuterFactor": Provided("flowdsl.team.outer_factor"),
    "function ncclTeamRankInDifference": Provided("flowdsl.team.rank_in_difference"),
    "function ncclTeamCft": Provided("flowdsl.cft.team", "mode: a flowdsl.cft.CftTeamMode, FLAT by default"),
    "function ncclTeamCftMultimem": MULTIMEM,
    "type ncclCftTeamMode_t": Provided("flowdsl.cft.CftTeamMode"),
    "value ncclCftTeamMode_t::NCCL_CFT_TEAM_FLAT": Provided("flowdsl.cft.CftTeamMode.FLAT", "cft.team's default"),
    "value ncclCftTeamMode_t::NCCL_CFT_TEAM_HIER_LSA": Provided(
        "flowdsl.cft.CftTeamMode.HIER_LSA",
        "one rank per LSA team: this LSA rank in every node of the CFT domain (the far team of "
        "collectives.programs.hierarchical_cft_all_gather)"),
    "value ncclCftTeamMode_t::NCCL_CFT_TEAM_HIER_MULTIMEM": Provided(
        "flowdsl.cft.CftTeamMode.HIER_MULTIMEM",
        "the team's numbers only: ncclTeamCftMultimem and multimem CFT barriers are not yet"),
    "type ncclTeamTagLsa": Provided("flowdsl.lsa.barrier", "lsa.barrier is the LSA team's barrier session"),
    "type ncclTeamTagRail": Provided("flowdsl.gin.rail_barrier", "gin.rail_barrier is the rail team's GIN barrier session"),
    "type ncclTeamTagWorld": Provided(
        "flowdsl.gin.world_barrier",
        "gin.world_barrier is the world team's GIN barrier session, gin.hybrid_barrier ncclBarrierSession's world form"),
    "function ncclGetLocalPointer": Provided("flowdsl.lsa.get_local_pointer", "typed: lsa.local_view"),
    "function ncclGetLsaPointer": Provided("flowdsl.lsa.get_lsa_pointer", "typed: lsa.lsa_view"),
    "function ncclGetPeerPointer": Provided(
        "flowdsl.lsa.get_peer_pointer",
        "the team overload is lsa.get_team_pointer; typed: lsa.peer_view, lsa.team_view"),
    "function ncclGetMultimemPointer": MULTIMEM,
    "function ncclGetLsaMultimemPointer": Provided(
        "flowdsl.lsa.multimem_view", "a typed view (window, element offset), taken only by flowdsl.mem's multimem "
        "operations and lsa's multimem helpers; the handle is the device communicator's own"),
    "function ncclGetCftLeInfo": Provided("flowdsl.cft.le_info"),
    "function ncclGetPeerLeInfo": Provided("flowdsl.cft.peer_le_info"),
    "function ncclGetMultimemLeInfo": MULTIMEM,
    "type ncclWindow_vidmem": _not_applicable(
        "the layout behind ncclWindow_t, read by NCCL's own code; flowdsl's windows (flowdsl.Window, "
        "comm.register) are handles"),
    "type ncclMultimemHandle": MULTIMEM,
    "type ncclDevResourceHandle": RESOURCE_BUFFERS,
    **_each("""
        function ncclGetResourceBuffer
        function ncclGetResourceBufferOffset
        function ncclGetResourceBufferLocalPointer
        function ncclGetResourceBufferLsaPointer
        function ncclGetResourceBufferPeerPointer
        function ncclGetResourceBufferCftLeInfo
        function ncclGetResourceBufferPeerLeInfo
    """, RESOURCE_BUFFERS),
    **_each("""
        function ncclGetResourceBufferMultimemPointer
        function ncclGetResourceBufferLsaMultimemPointer
        function ncclGetResourceBufferMultimemLeInfo
    """, MULTIMEM),
    "type ncclGinSignal_t": _not_applicable(INTEGER_ID),
    "type ncclGinCounter_t": _not_applicable(INTEGER_ID),
    "type ncclCftLeId": _not_applicable(INTEGER_ID + " (cft.le_info returns one)"),
    "type ncclGinRequest_t": GIN_REQUESTS,
    "type ncclLsaBarrierHandle": CUSTOM_TEAM_BARRIERS,
    "type ncclGinBarrierHandle": CUSTOM_TEAM_BARRIERS,
    "type ncclCftBarrierHandle": CUSTOM_TEAM_BARRIERS,
    "type ncclLLA2AHandle": LL_A2A,
    "type ncclGinConnectionType_t": Provided("flowdsl.GinConnectionType"),
    "value ncclGinConnectionType_t::NCCL_GIN_CONNECTION_NONE": Provided("flowdsl.GinConnectionType.NONE"),
    "value ncclGinConnectionType_t::NCCL_GIN_CONNECTION_FULL": Provided("flowdsl.GinConnectionType.FULL"),
    "value ncclGinConnectionType_t::NCCL_GIN_CONNECTION_RAIL": Provided("flowdsl.GinConnectionType.RAIL"),
    "value ncclGinConnectionType_t::NCCL_GIN_CONNECTION_CUSTOM_STRIDE": Provided(
        "flowdsl.GinConnectionType.CUSTOM_STRIDE"),
    "value ncclGinConnectionType_t::NCCL_GIN_CONNECTION_CUSTOM_ARRAY": CUSTOM_ARRAY,
    "type ncclGinType_t": Provided("flowdsl.GinBackend", "the same values (NCCL's ncclNetDeviceType)"),
    "value ncclGinType_t::NCCL_GIN_TYPE_NONE": _keyword("gin_type", "gin_type left out (or 0): NCCL picks"),
    "value ncclGinType_t::NCCL_GIN_TYPE_PROXY": Provided("flowdsl.GinBackend.PROXY"),
    "value ncclGinType_t::NCCL_GIN_TYPE_GDAKI": Provided("flowdsl.GinBackend.GDAKI"),
    "value ncclGinType_t::NCCL_GIN_TYPE_GPI": Provided("flowdsl.GinBackend.GPI"),
    "value ncclGinType_t::NCCL_GIN_TYPE_EFA_GDA": Provided("flowdsl.GinBackend.EFA_GDA"),
    "value ncclGinType_t::NCCL_GIN_MAX_TYPES": _not_applicable("a count of the enum's values, not a backend"),
    "type ncclCftCap_t": _keyword("cft_caps", "its values as an int"),
    "value ncclCftCap_t::NCCL_CFT_NONE": _keyword("cft_caps", "0, the default"),
    "value ncclCftCap_t::NCCL_CFT": _keyword("cft_caps", "1; cft_barrier_count > 0 sets it too"),
    "value ncclCftCap_t::NCCL_CFT_MULTIMEM": MULTIMEM,

    # ---- cooperative groups (coop.h) --------------------------------------------------------------------
    "type ncclCoopThread": Provided("flowdsl.coop.thread"),
    "type ncclCoopWarp": Provided("flowdsl.coop.warp"),
    "type ncclCoopLanes": Provided("flowdsl.coop.lanes"),
    "type ncclCoopWarpSpan": Provided("flowdsl.coop.warp_span"),
    "type ncclCoopCta": Provided("flowdsl.coop.cta"),
    "type ncclCoopTile": Provided("flowdsl.coop.tile", "a tile of 2 to 16 lanes is coop.lanes of its mask"),
    **{f"method {coop}::thread_rank": Provided("flowdsl.coop.thread_rank")
       for coop in ("ncclCoopTile", "ncclCoopLanes", "ncclCoopWarpSpan", "ncclCoopCta")},
    **{f"method {coop}::size": Provided("flowdsl.coop.size")
       for coop in ("ncclCoopTile", "ncclCoopLanes", "ncclCoopWarpSpan", "ncclCoopCta")},
    **{f"method {coop}::num_threads": Provided("flowdsl.coop.size", "NCCL's synonym of size")
       for coop in ("ncclCoopTile", "ncclCoopLanes", "ncclCoopWarpSpan", "ncclCoopCta")},
    **{f"method {coop}::sync": Provided("flowdsl.coop.sync")
       for coop in ("ncclCoopTile", "ncclCoopLanes", "ncclCoopWarpSpan", "ncclCoopCta")},
    "method ncclCoopTile::laneMask": Provided("flowdsl.coop.lane_mask"),
    "function ncclCoopGetLaneMask": Provided("flowdsl.coop.lane_mask"),
    "function ncclCoopIsThread": Provided("flowdsl.coop.is_thread"),
    "function ncclCoopWithinWarp": Provided("flowdsl.coop.within_warp"),
    "function ncclCoopCoalesced": Provided("flowdsl.coop.coalesced"),
    "function ncclCoopBcast": Provided("flowdsl.coop.bcast", "values of 4 or 8 bytes"),
    **_each("""
        function ncclCoopBcast_Cta_stash
        function ncclCoopBcast_WarpSpan_stash
    """, _not_applicable("the shared-memory stash of ncclCoopBcast's CTA and warp-span forms (flowdsl.coop.bcast "
                         "keeps its own), not called by users")),

    # ---- LSA barriers (lsa_barrier.h) -------------------------------------------------------------------
    "type ncclLsaBarrierSession": Provided(
        "flowdsl.lsa.barrier", "the LSA team's barriers; other teams, handles and multimem barriers not yet"),
    "method ncclLsaBarrierSession::arrive": Provided("flowdsl.lsa.arrive"),
    "method ncclLsaBarrierSession::wait": Provided("flowdsl.lsa.wait", TIMEOUTS),
    "method ncclLsaBarrierSession::sync": Provided("flowdsl.lsa.sync", TIMEOUTS),

    # ---- GIN (gin.h) ------------------------------------------------------------------------------------
    "type ncclGin": Provided("flowdsl.gin.context", "ncclGin(comm, index) with NCCL's default sharing mode"),
    "type ncclGin_BackendMask": BACKEND_MASKS,
    "type ncclGin_BackendOne": Provided(
        "flowdsl.FlowKernel.compile",
        "compile(..., gin_backend=...) links one backend's GIN code; a launch links its device communicator's"),
    "type ncclNetDeviceType": Provided("flowdsl.GinBackend", "the GIN backends' values, the same numbers"),
    "value ncclNetDeviceType::NCCL_NET_DEVICE_GIN_PROXY": Provided("flowdsl.GinBackend.PROXY"),
    "value ncclNetDeviceType::NCCL_NET_DEVICE_GIN_GDAKI": Provided("flowdsl.GinBackend.GDAKI"),
    "value ncclNetDeviceType::NCCL_NET_DEVICE_GIN_GPI": Provided("flowdsl.GinBackend.GPI"),
    "value ncclNetDeviceType::NCCL_NET_DEVICE_GIN_EFA_GDA": Provided("flowdsl.GinBackend.EFA_GDA"),
    **_each("""
        value ncclNetDeviceType::NCCL_NET_DEVICE_HOST
        value ncclNetDeviceType::NCCL_NET_DEVICE_UNPACK
    """, _not_applicable("network devices that are not GIN backends (the host's network, the unpack offload)")),
    "type ncclGinResourceSharingMode": SHARING_MODES,
    "value ncclGinResourceSharingMode::NCCL_GIN_RESOURCE_SHARING_GPU": Provided(
        "flowdsl.gin.context", "NCCL's default, the only mode gin.context makes"),
    "value ncclGinResourceSharingMode::NCCL_GIN_RESOURCE_SHARING_CTA": SHARING_MODES,
    "value ncclGinResourceSharingMode::NCCL_GIN_RESOURCE_SHARING_THREAD": SHARING_MODES,
    "type ncclGinOptFlags": OPT_FLAGS,
    "value ncclGinOptFlags::ncclGinOptFlagsDefault": Provided(
        "flowdsl.gin.put", "every flowdsl GIN operation passes the default"),
    "value ncclGinOptFlags::ncclGinOptFlagsMaySkipCreditCheck": OPT_FLAGS,
    "value ncclGinOptFlags::ncclGinOptFlagsAggregateRequests": OPT_FLAGS,
    "type ncclGinDescriptorSmem": DESCRIPTORS,
    "type ncclGin_DescriptorSmem": DESCRIPTORS,
    "type ncclGin_None": Provided("flowdsl.gin.put", "remote=None, local=None (the defaults)"),
    "type ncclGin_SignalInc": Provided("flowdsl.gin.signal_inc", LEGACY_SIGNAL),
    "type ncclGin_SignalAdd": Provided("flowdsl.gin.signal_add", LEGACY_SIGNAL),
    "type ncclGin_StrongSignalInc": Provided("flowdsl.gin.strong_signal_inc"),
    "type ncclGin_WeakSignalInc": Provided("flowdsl.gin.weak_signal_inc"),
    "type ncclGin_StrongSignalAdd": Provided("flowdsl.gin.strong_signal_add"),
    "type ncclGin_WeakSignalAdd": Provided("flowdsl.gin.weak_signal_add"),
    "type ncclGin_StrongVASignalInc": Provided("flowdsl.gin.strong_va_signal_inc"),
    "type ncclGin_WeakVASignalInc": Provided("flowdsl.gin.weak_va_signal_inc"),
    "type ncclGin_StrongVASignalAdd": Provided("flowdsl.gin.strong_va_signal_add"),
    "type ncclGin_WeakVASignalAdd": Provided("flowdsl.gin.weak_va_signal_add"),
    **_each("""
        type ncclGin_VASignalInc
        type ncclGin_VASignalAdd
    """, _not_yet("NCCL's legacy VA signals (deprecated for their strong and weak forms): not yet; flowdsl "
                  "has the strong and weak ones (gin.strong_va_signal_inc, ..., NCCL >= 2.32)")),
    "type ncclGin_CounterInc": Provided(
        "flowdsl.gin.counter_inc",
        "deprecated by NCCL; counter_inc is it before NCCL 2.32, ncclGin_WeakCounterInc after"),
    "type ncclGin_WeakCounterInc": Provided("flowdsl.gin.counter_inc", "NCCL >= 2.32"),
    "type ncclGin_SegmentDevice": Provided("flowdsl.gin.put", "the default: windows of device memory"),
    "type ncclGin_SegmentMixed": HOST_SEGMENTS,
    "type ncclGin_SegmentHostNuma": HOST_SEGMENTS,
    "method ncclGin::put": Provided("flowdsl.gin.put", "the window form; " + WINDOW_OFFSETS),
    "method ncclGin::putValue": Provided("flowdsl.gin.put_value", "the window form"),
    "method ncclGin::signal": Provided("flowdsl.gin.signal"),
    "method ncclGin::get": Provided("flowdsl.gin.get", "NCCL >= 2.32"),
    "method ncclGin::flush": Provided("flowdsl.gin.flush", "its timeout overload not yet"),
    "method ncclGin::flushAsync": GIN_REQUESTS,
    "method ncclGin::wait": GIN_REQUESTS,
    "method ncclGin::readSignal": Provided("flowdsl.gin.read_signal", "signals by id; " + VA_OVERLOAD),
    "method ncclGin::waitSignal": Provided("flowdsl.gin.wait_signal",
                                           "signals by id; " + VA_OVERLOAD + "; " + TIMEOUTS),
    "method ncclGin::resetSignal": Provided("flowdsl.gin.reset_signal", "signals by id; " + VA_OVERLOAD),
    "method ncclGin::readCounter": Provided("flowdsl.gin.read_counter"),
    "method ncclGin::waitCounter": Provided("flowdsl.gin.wait_counter", TIMEOUTS),
    "method ncclGin::resetCounter": Provided("flowdsl.gin.reset_counter"),
    **_each("""
        method ncclGin::getSignalShadowPtr
        method ncclGin::increaseSignalShadow
        method ncclGin::waitSignalMeetShadow
        method ncclGin::waitSignalFollowShadow
    """, SIGNAL_SHADOWS),

    # ---- GIN and hybrid barriers (gin_barrier.h, barrier.h) ---------------------------------------------
    "type ncclGinBarrierSession": Provided(
        "flowdsl.gin.rail_barrier", "gin.rail_barrier and gin.world_barrier (NCCL >= 2.30): the rail and world "
        "teams' barriers; other teams and ncclGinAllContexts not yet"),
    "method ncclGinBarrierSession::sync": Provided(
        "flowdsl.gin.rail_barrier", "the session's sync(order, fence=GinFenceLevel.PUT_GET); " + TIMEOUTS),
    "function ncclGinBarrier": Provided(
        "flowdsl.gin.rail_barrier", "gin.rail_barrier(ctx, coop, index).sync(order, fence) and gin.world_barrier(...): "
        "the rail and world teams' forms"),
    "type ncclGinFenceLevel": Provided("flowdsl.GinFenceLevel", "the same bit values; PUT_GET for Put | Get (NCCL "
                                       "2.32's default, flowdsl's too); NCCL 2.28 takes NONE only"),
    "value ncclGinFenceLevel::None": Provided("flowdsl.GinFenceLevel.NONE"),
    "value ncclGinFenceLevel::Relaxed": Provided("flowdsl.GinFenceLevel.NONE", "NCCL's deprecated name of None"),
    "value ncclGinFenceLevel::Put": Provided("flowdsl.GinFenceLevel.PUT", "NCCL >= 2.32"),
    "value ncclGinFenceLevel::Get": Provided("flowdsl.GinFenceLevel.GET", "NCCL >= 2.32"),
    "type ncclGinAllContexts": ALL_CONTEXTS,
    "type ncclBarrierSession": Provided(
        "flowdsl.gin.hybrid_barrier", "the world form (LSA in a node, GIN across); the LSA and rail forms not yet"),
    "method ncclBarrierSession::sync": Provided(
        "flowdsl.gin.hybrid_barrier", "the session's sync(order, fence=GinFenceLevel.PUT_GET), choosing its "
        "barriers by fence level as NCCL 2.32 does; " + TIMEOUTS),
    "method ncclBarrierSession::lsaBarrier": Provided(
        "flowdsl.gin.hybrid_barrier", "session.lsa_barrier(): its sync(order) only (NCCL's LSA session also has "
        "arrive and wait); " + TIMEOUTS),
    "method ncclBarrierSession::ginBarrier": Provided(
        "flowdsl.gin.hybrid_barrier", "session.gin_barrier(): the rail team's GIN session, its sync(order, "
        "fence=GinFenceLevel.PUT_GET); " + TIMEOUTS),
    "function ncclBarrier": Provided(
        "flowdsl.gin.hybrid_barrier",
        "gin.hybrid_barrier(ctx, coop, index).sync(order, fence): the world form"),

    # ---- CFT (cft.h, cft_barrier.h) ---------------------------------------------------------------------
    "type ncclCft": Provided("flowdsl.cft.session", "the session's state lives in the storage it is given"),
    "type ncclCftSmem": Provided("flowdsl.cft.SESSION_WORDS", "cft.session's shared-memory storage, this many u64"),
    "method ncclCft::put": Provided("flowdsl.cft.put"),
    "method ncclCft::putCounted": Provided("flowdsl.cft.put_counted", "NCCL >= 2.32"),
    "method ncclCft::get": Provided("flowdsl.cft.get"),
    "method ncclCft::submit": Provided("flowdsl.cft.submit"),
    "method ncclCft::flush": Provided("flowdsl.cft.flush", "returns the report as 0x100 | report"),
    "method ncclCft::flushSmem": Provided("flowdsl.cft.flush_smem"),
    "method ncclCft::waitCounted": Provided("flowdsl.cft.wait_counted", "NCCL >= 2.32; " + TIMEOUTS),
    **_each("""
        method ncclCft::putCpMask
        method ncclCft::red
        method ncclCft::redCounted
        method ncclCft::pullRed
    """, CFT_OPERATIONS),
    **_each("""
        method ncclCft::putMultimem
        method ncclCft::putMultimemCounted
        method ncclCft::putMultimemCpMask
        method ncclCft::redMultimem
        method ncclCft::redMultimemCounted
    """, MULTIMEM),
    "function ncclMemFence": Provided("flowdsl.cft.fence"),
    "type ncclMemProxyType": Provided("flowdsl.cft.MemProxyType"),
    "value ncclMemProxyType::Generic": Provided("flowdsl.cft.MemProxyType.GENERIC"),
    "value ncclMemProxyType::Fabric": Provided("flowdsl.cft.MemProxyType.FABRIC"),
    "type ncclMemFenceScope": Provided("flowdsl.cft.MemFenceScope"),
    "value ncclMemFenceScope::Cta": Provided("flowdsl.cft.MemFenceScope.CTA"),
    "value ncclMemFenceScope::Sys": Provided("flowdsl.cft.MemFenceScope.SYS"),
    "type ncclCftBarrierSession": Provided("flowdsl.cft.barrier", "multimem CFT barriers not yet"),
    "method ncclCftBarrierSession::arrive": Provided("flowdsl.cft.barrier", "the session's arrive"),
    "method ncclCftBarrierSession::wait": Provided("flowdsl.cft.barrier", "the session's wait; " + TIMEOUTS),
    "method ncclCftBarrierSession::sync": Provided("flowdsl.cft.barrier", "the session's sync; " + TIMEOUTS),

    # ---- symmetric pointers (ptr.h) ---------------------------------------------------------------------
    "type ncclSymPtr": _not_applicable(WINDOW_OFFSETS),
    "method ncclSymPtr::localPtr": Provided("flowdsl.lsa.local_view", "(window, element offset) for the ncclSymPtr"),
    "method ncclSymPtr::lsaPtr": Provided("flowdsl.lsa.lsa_view", "(window, element offset) for the ncclSymPtr"),
    "method ncclSymPtr::peerPtr": Provided(
        "flowdsl.lsa.peer_view", "(window, element offset) for the ncclSymPtr; the team overload is lsa.team_view"),
    "method ncclSymPtr::multimemPtr": MULTIMEM,
    "method ncclSymPtr::lsaMultimemPtr": Provided("flowdsl.lsa.multimem_view",
                                                  "(window, element offset) for the ncclSymPtr"),

    # ---- reduce and copy helpers (reduce_copy.h) --------------------------------------------------------
    "function ncclLsaReduceSum": Provided("flowdsl.lsa.reduce_sum", WRITTEN_IN_FLOWDSL),
    "function ncclLsaCopy": Provided("flowdsl.lsa.copy", WRITTEN_IN_FLOWDSL),
    "function ncclLsaReduceSumCopy": Provided("flowdsl.lsa.reduce_sum_copy", WRITTEN_IN_FLOWDSL),
    **_each("""
        function ncclLsaReduceLsaCopy
        function ncclLsaReduceSumLsaCopy
        function ncclLocalReduceSum
        function ncclLocalCopy
        function ncclLocalReduceSumCopy
        function ncclLsaCopyTma
    """, REDUCE_COPY),
    **_each("""
        function ncclLsaReduceMultimemCopy
        function ncclLsaReduceSumMultimemCopy
        function ncclMultimemReduceSumLsaCopy
        function ncclMultimemReduceSumMultimemCopy
    """, MULTIMEM),
    "function ncclMultimemReduceSum": Provided("flowdsl.lsa.multimem_reduce_sum", MULTIMEM_HELPER),
    "function ncclMultimemCopy": Provided("flowdsl.lsa.multimem_copy", MULTIMEM_HELPER),
    "function ncclMultimemReduceSumCopy": Provided("flowdsl.lsa.multimem_reduce_sum_copy", MULTIMEM_HELPER),

    # ---- LL all-to-all (ll_a2a.h) -----------------------------------------------------------------------
    **_each("""
        type ncclLLA2ASession
        method ncclLLA2ASession::send
        method ncclLLA2ASession::bcast
        method ncclLLA2ASession::recv
        method ncclLLA2ASession::recvUnrolled
        method ncclLLA2ASession::recvReduce
        method ncclLLA2ASession::endEpoch
    """, LL_A2A),

    # ---- NCCL's Flow (flow.h, lsa_flow.h, gin_flow.h) ---------------------------------------------------
    **_each("""
        type ncclFlowConfig
        type ncclFlowConnState
        type ncclFlowShmem
        type ncclFlowProtocol
        value ncclFlowProtocol::ncclFlowProtocolSimple
        value ncclFlowProtocol::ncclFlowProtocolLL
        value ncclFlowProtocol::ncclFlowProtocolLL128
        value ncclFlowProtocol::ncclFlowProtocolCount
        type ncclFlowProcessor
        method ncclFlowProcessor::process
        method ncclFlowProcessor::close
        type ncclLsaFlowProcessor
        function ncclFlowThreadPart
        type ncclFlowNullPtrFn
        type ncclFlowSendTag
        type ncclFlowSend
        type ncclFlowDirectSend
        type ncclFlowNoSend
        type ncclFlowRecvTag
        type ncclFlowRecv
        type ncclFlowDirectRecv
        type ncclFlowNoRecv
        type ncclLsaFlowConn
        method ncclLsaFlowConn::waitSend
        method ncclLsaFlowConn::postSend
        method ncclLsaFlowConn::waitRecv
        method ncclLsaFlowConn::postRecv
        method ncclLsaFlowConn::advanceStep
        method ncclLsaFlowConn::advanceSlice
        method ncclLsaFlowConn::stepFlag
        method ncclLsaFlowConn::close
        type ncclGinFlowConn
        method ncclGinFlowConn::waitSend
        method ncclGinFlowConn::postSend
        method ncclGinFlowConn::postSendFrom
        method ncclGinFlowConn::postSendDirect
        method ncclGinFlowConn::postSendSimple
        method ncclGinFlowConn::waitRecv
        method ncclGinFlowConn::postRecv
        method ncclGinFlowConn::signal
        method ncclGinFlowConn::advanceStep
        method ncclGinFlowConn::advanceSlice
        method ncclGinFlowConn::stepFlag
        method ncclGinFlowConn::close
    """, NCCL_FLOW),
}


# ---- NCCL 2.32.3's C API for LLVM IR (gin.h, coop.h; NCCL_IR_EXTERN_C; gone in 2.32.6) ----------------
# Flat C functions over a type-erased coop (ncclCoopAny) for languages that cannot instantiate NCCL's
# templates. Each does what one of ncclGin's methods does, so each gets that method's flowdsl name or
# refusal; flowdsl's support library has its own C wrappers (prebuilt/), so nothing here is needed to
# reach them.
C_API = "NCCL 2.32.3's C form (for LLVM IR) of "
#: C function -> the method (or type) of the C++ API it is the C form of.
C_FORMS = {
    "function ncclGin_C_init": "type ncclGin",
    "function ncclGinPut": "method ncclGin::put",
    "function ncclGinPut_v2": "method ncclGin::put",
    "function ncclGinPut_v3": "method ncclGin::put",
    "function ncclGinPutValue": "method ncclGin::putValue",
    "function ncclGinPutValue_v2": "method ncclGin::putValue",
    "function ncclGinPutValue_v3": "method ncclGin::putValue",
    "function ncclGinGet": "method ncclGin::get",
    "function ncclGinGet_v2": "method ncclGin::get",
    "function ncclGinSignal": "method ncclGin::signal",
    "function ncclGinSignal_v2": "method ncclGin::signal",
    "function ncclGinSignal_v3": "method ncclGin::signal",
    "function ncclGinFlush": "method ncclGin::flush",
    "function ncclGinFlush_v2": "method ncclGin::flush",
    "function ncclGinFlushAsync": "method ncclGin::flushAsync",
    "function ncclGinWait": "method ncclGin::wait",
    "function ncclGinWaitTimeout": "method ncclGin::wait",
    "function ncclGinReadCounter": "method ncclGin::readCounter",
    "function ncclGinWaitCounter": "method ncclGin::waitCounter",
    "function ncclGinResetCounter": "method ncclGin::resetCounter",
    "function ncclGinGetSignalShadowPtr": "method ncclGin::getSignalShadowPtr",
    "function ncclGinIncreaseSignalShadow": "method ncclGin::increaseSignalShadow",
    "function ncclGinReadSignal": "method ncclGin::readSignal",
    "function ncclGinWaitSignal": "method ncclGin::waitSignal",
    "function ncclGinWaitSignalMeetShadow": "method ncclGin::waitSignalMeetShadow",
    "function ncclGinWaitSignalFollowShadow": "method ncclGin::waitSignalFollowShadow",
    "function ncclGinResetSignal": "method ncclGin::resetSignal",
}


def _c_form(entry: str, method: str):
    """The outcome of C function ``entry``: ``method``'s, its note saying which C form it is."""
    outcome = COVERAGE[method]
    what = method.split(" ", 1)[1]
    if isinstance(outcome, Provided):
        return Provided(outcome.name, C_API + what + (f"; {outcome.note}" if outcome.note else ""))
    return outcome


COVERAGE.update({entry: _c_form(entry, method) for entry, method in C_FORMS.items()})
_TIMEOUT_FORMS = {
    "function ncclGinFlushTimeout": "flowdsl.gin.flush",
    "function ncclGinWaitCounterTimeout": "flowdsl.gin.wait_counter",
    "function ncclGinWaitSignalTimeout": "flowdsl.gin.wait_signal",
}
COVERAGE.update({entry: Provided(name, C_API + "a wait with a timeout; " + TIMEOUTS)
                 for entry, name in _TIMEOUT_FORMS.items()})
COVERAGE.update({
    **_each("""
        function ncclGinReadSignalVA
        function ncclGinResetSignalVA
        function ncclGinWaitSignalVA
        function ncclGinWaitSignalTimeoutVA
    """, _not_yet("NCCL 2.32.3's C form (for LLVM IR) of the VA signal overloads of readSignal, waitSignal and "
                  "resetSignal: not yet, as those overloads; flowdsl kernels read a VA signal with flowdsl.mem")),
    "function ncclGin_C_initWithResourceSharingMode": SHARING_MODES,
    "type ncclGin_C": Provided("flowdsl.gin.context", C_API + "ncclGin: a GIN context"),
    "type ncclCoopAny": Provided("flowdsl.coop.cta", "NCCL 2.32.3's type-erased coop of its C API: flowdsl's "
                                 "calls take any coop (flowdsl.coop.thread, warp, lanes, tile, warp_span, cta)"),
    "method ncclCoopAny::thread_rank": Provided("flowdsl.coop.thread_rank", "of any coop"),
    "method ncclCoopAny::size": Provided("flowdsl.coop.size", "of any coop"),
    "method ncclCoopAny::num_threads": Provided("flowdsl.coop.size", "of any coop"),
    "method ncclCoopAny::sync": Provided("flowdsl.coop.sync", "of any coop"),
    "method ncclCoopAny::get_vtable": _not_applicable(
        "the type erasure's own table (NCCL's C API); flowdsl's coops are typed when the kernel compiles"),
    "type ncclGinSegmentType": Provided("flowdsl.gin.put", C_API + "the segment tags: device memory only"),
    "value ncclGinSegmentType::ncclGinSegmentTypeDevice": Provided(
        "flowdsl.gin.put", "the default: windows of device memory"),
    "value ncclGinSegmentType::ncclGinSegmentTypeMixed": HOST_SEGMENTS,
    "value ncclGinSegmentType::ncclGinSegmentTypeHostNuma": HOST_SEGMENTS,
    "type ncclGinSignalOp_t": Provided("flowdsl.gin.strong_signal_inc", C_API + "the signal actions: inc or add, "
                                       "each its own flowdsl action (strong_signal_inc, strong_signal_add, ...)"),
    "value ncclGinSignalOp_t::ncclGinSignalInc": Provided("flowdsl.gin.strong_signal_inc",
                                                          "and weak_signal_inc, signal_inc"),
    "value ncclGinSignalOp_t::ncclGinSignalAdd": Provided("flowdsl.gin.strong_signal_add",
                                                          "and weak_signal_add, signal_add"),
    "type ncclGinSignalType": Provided("flowdsl.gin.strong_signal_inc", C_API + "the signal kinds: none, "
                                       "by id, VA; each its own flowdsl action"),
    "value ncclGinSignalType::NCCL_GIN_SIGNAL_TYPE_NONE": Provided("flowdsl.gin.put", "remote=None"),
    "value ncclGinSignalType::NCCL_GIN_SIGNAL_TYPE_INDEXED": Provided(
        "flowdsl.gin.strong_signal_inc", "signals by id: strong_*, weak_*, signal_*"),
    "value ncclGinSignalType::NCCL_GIN_SIGNAL_TYPE_VA": Provided(
        "flowdsl.gin.strong_va_signal_inc", "strong_va_signal_inc/add, weak_va_signal_inc/add"),
})


def category(entry: str) -> str:
    """:data:`PROVIDED`, the refusal's category, or ``"missing"`` for an entry the table lacks."""
    outcome = COVERAGE.get(entry)
    if isinstance(outcome, Provided):
        return PROVIDED
    return outcome.category if isinstance(outcome, Refused) else "missing"
