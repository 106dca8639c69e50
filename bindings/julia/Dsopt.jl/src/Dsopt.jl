"""
    Dsopt

Julia binding of dsopt (`libdsopt`): data-parallel optimizers (Adam, AdamW,
1-bit Adam) behind a C ABI.

```julia
using Dsopt
w, b = randn(Float32, 1000), zeros(Float32, 10)
opt = Optimizer(\"\"\"{"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}\"\"\", [w, b])
info = step!(opt, [gw, gb])        # w and b are updated in place
grad_ready!(opt, 2, gb); grad_ready!(opt, 1, gw); info = step!(opt)  # handed over during backward
blob = state_save(opt); state_load!(opt, blob)
state_load_shards!(opt, [blob])    # all ranks' blobs of a run at any world size
rebind_params!(opt, [w2, b2])      # the parameters moved to new arrays
memory_usage(opt)                  # (host = bytes, device = bytes)
close(opt)
```

Every failing call throws a [`DsoptError`](@ref) with the status code and the
library's detail message. Arguments the binding rejects before calling the
library throw `ArgumentError`. Group and parameter numbers are 1-based, as
in Julia: group `g` is entry `g` of the config's `"param_groups"`.
"""
module Dsopt

using Libdl

export DsoptError, Communicator, Optimizer, StepInfo, BF16Bits,
       PHASE_SKIPPED, PHASE_FULL, PHASE_COMPRESSED, PHASE_LOCAL, PHASE_SYNC,
       mpi_communicator, nccl_communicator, custom_communicator, Collectives,
       comm_rank, comm_size, set_nodes!,
       step!, grad_ready!, set_lr!, set_group_lr!, set_gradient_clipping!, gradient_clipping, threads, group_lr, num_groups, loss_scale,
       group_param, set_group_param!, group_param_names, param_step, set_param_step!,
       algorithm_names, describe, Algorithm, param_steps, supports_zero, offload, compressed,
       state_save, state_load!, state_load_ex!, state_load_shards!, memory_usage, state_memory_usage,
       set_momentum_mask!, rebind_params!, config, canonical_config,
       gather_buckets, gather_bucket_of, gathers_pending, wait_gather!, wait_gather_bucket!,
       set_gather_order!,
       Codec, encoded_size, residual_size, encode!, encode, decode_sum!

# ---- the library ---------------------------------------------------------------

# ccall opens "libdsopt" on first use, searching Libdl.DL_LOAD_PATH before the
# system loader path; __init__ puts $DSOPT_LIBRARY_DIR there, else the
# in-tree build directory <repo>/build when it holds the library.
const libdsopt = "libdsopt"
const REPO_BUILD_DIR = normpath(joinpath(@__DIR__, "..", "..", "..", "..", "build"))

function __init__()
    dir = get(ENV, "DSOPT_LIBRARY_DIR", "")
    if isempty(dir) && isfile(joinpath(REPO_BUILD_DIR, "libdsopt." * Libdl.dlext))
        dir = REPO_BUILD_DIR
    end
    isempty(dir) || pushfirst!(Libdl.DL_LOAD_PATH, dir)
    return nothing
end

# ---- status codes and errors (include/dsopt.h) -----------------------------------

const DSOPT_OK           = Cint(0)
const DSOPT_EINVAL       = Cint(-1)
const DSOPT_EUNSUPPORTED = Cint(-2)
const DSOPT_ENOMEM       = Cint(-3)
const DSOPT_EBUFS        = Cint(-4)
const DSOPT_ECORRUPT     = Cint(-5)
const DSOPT_EMISMATCH    = Cint(-6)
const DSOPT_ECOMM        = Cint(-7)
const DSOPT_ECUDA        = Cint(-8)
const DSOPT_EINTERNAL    = Cint(-9)
const DSOPT_ENONFINITE   = Cint(-10)

# dsopt_state_load_ex flags
const DSOPT_LOAD_RESET_RANK_LOCAL = UInt32(1)
const DSOPT_LOAD_WITHOUT_RANK_LOCAL = UInt32(2)  # the blob carries no rank-local state

const DSOPT_FLOAT32  = Int32(0)
const DSOPT_FLOAT16  = Int32(1)
const DSOPT_BFLOAT16 = Int32(2)

"""
    DsoptError(code, status, message)

A dsopt call failed. `code` is the C status (`DSOPT_EINVAL` = -1, ...,
`DSOPT_EINTERNAL` = -9, `DSOPT_ENONFINITE` = -10), `status` its fixed text
(`dsopt_status_string`) and `message` the library's detail for this failure
(`dsopt_last_error`).

`Dsopt.DSOPT_ENONFINITE` comes from [`step!`](@ref): training is not
progressing (`"max_consecutive_skips"` steps in a row skipped for Inf/NaN
gradients, or an fp16 overflow at `min_loss_scale`). That step was skipped
like any other and the next `step!` may continue; its `StepInfo` is not
returned with the error.
"""
struct DsoptError <: Exception
    code::Int
    status::String
    message::String
end

function DsoptError(code::Integer)
    # The detail first: it stays valid only until the next dsopt call on this thread.
    message = unsafe_string(ccall((:dsopt_last_error, libdsopt), Cstring, ()))
    status = unsafe_string(ccall((:dsopt_status_string, libdsopt), Cstring, (Cint,), code))
    return DsoptError(code, status, message)
end

function Base.showerror(io::IO, e::DsoptError)
    print(io, "DsoptError: ", e.status, " (", e.code, ")")
    isempty(e.message) || print(io, ": ", e.message)
end

"""
    @check ccall(...)

Runs a dsopt call that returns a status and throws a [`DsoptError`](@ref)
unless it is `DSOPT_OK`. The error is read at once, on the same thread.
"""
macro check(call)
    quote
        local rc = $(esc(call))
        rc == DSOPT_OK || throw(DsoptError(rc))
        nothing
    end
end

# ---- versions ------------------------------------------------------------------

"Version of the loaded libdsopt."
function version()
    n = Int(ccall((:dsopt_version_number, libdsopt), Cint, ()))
    return VersionNumber(n ÷ 10000, (n ÷ 100) % 100, n % 100)
end

"What the loaded libdsopt was built with, as `key=value` pairs."
build_info() = unsafe_string(ccall((:dsopt_build_info, libdsopt), Cstring, ()))

# ---- tensors -------------------------------------------------------------------

# The C dsopt_tensor: a flat, contiguous buffer (24 bytes, no padding).
struct CTensor
    data::Ptr{Cvoid}
    numel::Int64
    dtype::Int32
    group::Int32
end

"""
    BF16Bits(a::AbstractArray{UInt16})

Tags an array of raw bfloat16 bits as a bfloat16 tensor (Julia has no
built-in bfloat16 type). Arrays whose element type is named `BFloat16`
(BFloat16s.jl) are accepted as they are.
"""
struct BF16Bits{A<:AbstractArray{UInt16}}
    array::A
end

dtype_code(::Type{Float32}) = DSOPT_FLOAT32
dtype_code(::Type{Float16}) = DSOPT_FLOAT16
function dtype_code(T::Type)
    if T isa DataType && isbitstype(T) && nameof(T) === :BFloat16 && sizeof(T) == 2
        return DSOPT_BFLOAT16
    end
    throw(ArgumentError("dsopt: unsupported element type $T " *
                        "(Float32, Float16, BFloat16, or BF16Bits of UInt16 bits)"))
end

# Column-major and without gaps: dsopt sees a flat buffer.
function is_contiguous(a::AbstractArray)
    a isa DenseArray && return true
    a isa StridedArray || return false
    expected = 1
    for (n, s) in zip(size(a), strides(a))
        n == 1 || s == expected || return false
        expected *= n
    end
    return true
end

# The C descriptor of a parameter, gradient or mask. The caller keeps `x`
# referenced (GC.@preserve or a field) for as long as dsopt may use it.
function ctensor(x, what::AbstractString, group::Integer)
    if x isa BF16Bits
        a, code = x.array, DSOPT_BFLOAT16
    elseif x isa AbstractArray
        a, code = x, dtype_code(eltype(x))
    else
        throw(ArgumentError("dsopt: $what must be an array of Float32, Float16 or " *
                            "BFloat16, or BF16Bits(bits), got $(typeof(x))"))
    end
    is_contiguous(a) ||
        throw(ArgumentError("dsopt: $what must be contiguous (an Array or a contiguous view); " *
                            "pass copy($what) and keep that copy"))
    # reinterpret also takes device pointers (CuPtr) of arrays on the GPU.
    return CTensor(reinterpret(Ptr{Cvoid}, pointer(a)), length(a), code, Int32(group))
end

# ---- communicators -------------------------------------------------------------

"""
    Communicator()

A world of one rank (no communication). See also [`mpi_communicator`](@ref),
[`nccl_communicator`](@ref) and [`custom_communicator`](@ref). `close(comm)` releases it (never the MPI or
NCCL communicator behind it); while optimizers still use it, the release
waits for the last of them to close. A finalizer closes it too.
"""
mutable struct Communicator
    handle::Ptr{Cvoid}
    kind::Symbol          # :local, :mpi, :nccl or :custom
    users::Int            # open optimizers on it
    close_requested::Bool
    keep::Any             # the object the MPI/NCCL communicator came from; a custom
                          # communicator's CustomState (dsopt's `user` pointer)
    nodes::Any            # (node, rail) of set_nodes!, or nothing

    function Communicator(kind::Symbol, keep, create::Function)
        out = Ref{Ptr{Cvoid}}(C_NULL)
        @check create(out)
        comm = new(out[], kind, 0, false, keep, nothing)
        return finalizer(close, comm)
    end
end

Communicator() = Communicator(:local, nothing, out ->
    ccall((:dsopt_comm_create_local, libdsopt), Cint, (Ref{Ptr{Cvoid}},), out))

"""
    mpi_communicator(fortran_handle::Integer; keep=nothing)

Wraps an MPI communicator given by its Fortran handle (`MPI_Comm_c2f(comm)`
in C). MPI must be initialised, and the communicator must outlive the
returned object; `keep` is kept referenced for that purpose (the MPI.jl
communicator object, say).
"""
mpi_communicator(fortran_handle::Integer; keep=nothing) = Communicator(:mpi, keep, out ->
    ccall((:dsopt_comm_create_mpi, libdsopt), Cint, (Ref{Ptr{Cvoid}}, Int64),
          out, fortran_handle))

"""
    nccl_communicator(comm::Ptr, stream::Ptr=C_NULL; keep=nothing)

Wraps an NCCL communicator (`ncclComm_t`) and the CUDA stream dsopt's device
work runs on (`C_NULL`: the legacy default stream). Both must outlive the
returned object.
"""
nccl_communicator(comm::Ptr, stream::Ptr=C_NULL; keep=nothing) = Communicator(:nccl, keep, out ->
    ccall((:dsopt_comm_create_nccl, libdsopt), Cint, (Ref{Ptr{Cvoid}}, Ptr{Cvoid}, Ptr{Cvoid}),
          out, comm, stream))

# ---- custom communicators (dsopt_comm_create_custom) -----------------------------
#
# UNTESTED: no Julia runtime on the machine this was written on. CCommOps
# mirrors `dsopt_comm_ops` of include/dsopt.h field for field (keep them in
# step): four 32-bit integers, then seven pointers, with no padding on 32- or
# 64-bit targets. Julia lays out an immutable struct of bits types as C does.

const DSOPT_COMM_FLOAT32 = Int32(0)
const DSOPT_COMM_FLOAT64 = Int32(1)
const DSOPT_COMM_INT32   = Int32(2)
const DSOPT_COMM_INT64   = Int32(3)
const DSOPT_COMM_UINT8   = Int32(4)
const DSOPT_COMM_SUM     = Int32(0)
const DSOPT_COMM_MAX     = Int32(1)
const DSOPT_COMM_HOST    = Int32(0)
const DSOPT_COMM_CUDA    = Int32(1)

# The C dsopt_comm_ops: 72 bytes on 64-bit targets.
struct CCommOps
    struct_size::UInt32     # sizeof(dsopt_comm_ops)
    flags::UInt32           # 0 (DSOPT_COMM_CONCURRENT is never set: see Collectives)
    rank::Int32
    size::Int32
    stream::Ptr{Cvoid}      # struct CUstream_st *
    allreduce::Ptr{Cvoid}   # int (*)(const void *send, void *recv, size_t count, int32_t elem,
                            #         int32_t op, int32_t device, void *user)
    reduce_scatter::Ptr{Cvoid}  # same signature as allreduce
    allgather::Ptr{Cvoid}   # int (*)(const void *send, void *recv, size_t count, int32_t elem,
                            #         int32_t device, void *user)
    alltoall::Ptr{Cvoid}    # same signature as allgather
    error_message::Ptr{Cvoid}   # const char *(*)(int code, void *user)
    release::Ptr{Cvoid}     # void (*)(void *user)
end

@assert sizeof(CCommOps) == 4 * sizeof(UInt32) + 7 * sizeof(Ptr{Cvoid}) &&
        fieldoffset(CCommOps, 5) == 16 "CCommOps does not match dsopt_comm_ops"

"""
    Collectives(; rank, size, allreduce, reduce_scatter, allgather, alltoall, device=nothing)

The collectives of a custom communicator ([`custom_communicator`](@ref)): the
caller's own functions, called by dsopt on every rank, in the same order,
one at a time. `rank` is 0-based, `0 <= rank < size`. `count` below is the
number of elements per rank (> 0). On host memory the functions get `Vector`s
of `T` ∈ (`Float32`, `Float64`, `Int32`, `Int64`, `UInt8`) that wrap dsopt's
buffers without copying: valid only during the call (keep no reference), and
`send` must not be written.

- `allreduce(data, op)`: in place, `data[i] = op` over ranks of `data[i]`
  (`count` elements); `op` is `:sum` or `:max`.
- `reduce_scatter(recv, send, op)`: `send` holds `size * count` elements;
  `recv` (`count`) gets the `op` over ranks of block `rank` of `send`
  (elements `rank * count + 1 : (rank + 1) * count`).
- `allgather(recv, send)`: `recv` (`size * count`) gets rank `r`'s `send`
  (`count`) as block `r`.
- `alltoall(recv, send)`: both hold `size * count` elements; block `j` of
  `send` goes to rank `j`, block `i` of `recv` comes from rank `i`.
- `device` (optional), for optimizers with `"device": "cuda"`:
  `device(kind, send::Ptr{Cvoid}, recv::Ptr{Cvoid}, count, T, op, stream::Ptr{Cvoid})`
  with `kind` one of `:allreduce`, `:reduce_scatter`, `:allgather`,
  `:alltoall`, raw device pointers (send == recv for an in-place allreduce),
  `op` `:sum`, `:max` or `nothing`; finish the collective before returning or
  order it on `stream`. Without it, device collectives fail.

On host memory dsopt computes every floating-point sum over ranks itself, in a
fixed order, from `alltoall` and `allgather`: `allreduce` and
`reduce_scatter` see only integer sums and maxima, and results do not depend
on the implementation.

A function fails by throwing: dsopt fails the call that was running with
`Dsopt.DSOPT_ECOMM` and the exception's text (`sprint(showerror, e)`), and
calls the communicator no more. It must throw rather than wait forever for a
rank that failed (a timeout), so that every rank fails instead of hanging.

The functions run inside a `ccall` into libdsopt, on the task that made it:
they must not yield (no `sleep`, `wait`, `Channel`s, `@sync`; blocking MPI
calls are fine). dsopt is never allowed to call them from a thread of its
own (`DSOPT_COMM_CONCURRENT` is not set): the Julia thread blocked in the
`ccall` could not reach a GC safepoint while such a callback allocated, so
`grad_ready!` reductions do not overlap backward here.

# MPI.jl

For an MPI that libdsopt was not built against (MPI.jl's own binaries, say;
otherwise [`mpi_communicator`](@ref) is simpler):

```julia
using MPI, Dsopt
MPI.Init()
world = MPI.COMM_WORLD
rank, nranks = MPI.Comm_rank(world), MPI.Comm_size(world)
mpi_op(op) = op === :sum ? MPI.SUM : MPI.MAX
coll = Collectives(
    rank = rank, size = nranks,
    allreduce = (data, op) -> MPI.Allreduce!(data, mpi_op(op), world),
    # An allreduce of the whole buffer, then this rank's block: simple, and
    # dsopt calls it only for small integer buffers on the host (MPI.jl's
    # low-level MPI.API.MPI_Reduce_scatter_block is the direct call).
    reduce_scatter = (recv, send, op) -> begin
        total = MPI.Allreduce!(copy(send), mpi_op(op), world)
        n = length(recv)
        copyto!(recv, 1, total, rank * n + 1, n)
    end,
    allgather = (recv, send) -> MPI.Allgather!(send, MPI.UBuffer(recv, length(send)), world),
    alltoall = (recv, send) -> MPI.Alltoall!(MPI.UBuffer(send, length(send) ÷ nranks),
                                             MPI.UBuffer(recv, length(recv) ÷ nranks), world))
comm = custom_communicator(coll)
opt = Optimizer(config, [w, b], comm)
# ... step!(opt, grads) on every rank ...
close(opt); close(comm)
```

MPI.jl's collectives have no timeout: with MPI's default error handler a
failing rank aborts the job rather than leaving the others waiting.
"""
struct Collectives
    rank::Int
    size::Int
    allreduce::Any
    reduce_scatter::Any
    allgather::Any
    alltoall::Any
    device::Any
end

Collectives(; rank::Integer, size::Integer, allreduce, reduce_scatter, allgather, alltoall,
            device=nothing) =
    Collectives(rank, size, allreduce, reduce_scatter, allgather, alltoall, device)

# What dsopt's `user` pointer points to. The Communicator keeps it referenced
# (field `keep`) until dsopt_comm_destroy, so the pointer stays valid (Julia's
# GC does not move objects).
mutable struct CustomState
    collectives::Collectives
    stream::Ptr{Cvoid}
    message::Vector{UInt8}   # NUL-terminated text of the last failure
    released::Bool
end

function comm_eltype(code::Int32)
    code == DSOPT_COMM_FLOAT32 && return Float32
    code == DSOPT_COMM_FLOAT64 && return Float64
    code == DSOPT_COMM_INT32 && return Int32
    code == DSOPT_COMM_INT64 && return Int64
    code == DSOPT_COMM_UINT8 && return UInt8
    throw(ArgumentError("dsopt passed an unknown element type (code $code)"))
end

function comm_op(code::Int32)
    code == DSOPT_COMM_SUM && return :sum
    code == DSOPT_COMM_MAX && return :max
    throw(ArgumentError("dsopt passed an unknown reduction (code $code)"))
end

function on_device(code::Int32)
    code == DSOPT_COMM_HOST && return false
    code == DSOPT_COMM_CUDA && return true
    throw(ArgumentError("dsopt passed an unknown buffer location (code $code)"))
end

# Runs one collective: 0, or 1 with the exception's text in state.message.
# Nothing is thrown through the C frames of libdsopt.
function run_collective(f, user::Ptr{Cvoid})
    state = unsafe_pointer_to_objref(user)::CustomState
    try
        f(state)
        return Cint(0)
    catch e
        text = try
            sprint(showerror, e)
        catch
            "a collective threw an exception of type $(typeof(e))"
        end
        isempty(text) && (text = "a collective failed (no message)")
        state.message = push!(Vector{UInt8}(replace(text, '\0' => "\\0")), 0x00)
        return Cint(1)
    end
end

function device_call(state::CustomState, kind::Symbol, send, recv, n, T, op)
    device = state.collectives.device
    device === nothing &&
        error("this custom communicator has host collectives only ($kind on device memory)")
    device(kind, Ptr{Cvoid}(send), Ptr{Cvoid}(recv), n, T, op, state.stream)
    return nothing
end

# Host arrays over dsopt's buffers, without copies (own=false: dsopt frees them).
wrap(::Type{T}, p::Ptr{Cvoid}, n::Integer) where {T} = unsafe_wrap(Array, Ptr{T}(p), n; own=false)

function custom_allreduce(send::Ptr{Cvoid}, recv::Ptr{Cvoid}, count::Csize_t, elem::Int32,
                          op::Int32, device::Int32, user::Ptr{Cvoid})::Cint
    return run_collective(user) do state
        T, o, n = comm_eltype(elem), comm_op(op), Int(count)
        on_device(device) && return device_call(state, :allreduce, send, recv, n, T, o)
        send == recv || unsafe_copyto!(Ptr{T}(recv), Ptr{T}(send), n)
        state.collectives.allreduce(wrap(T, recv, n), o)
    end
end

function custom_reduce_scatter(send::Ptr{Cvoid}, recv::Ptr{Cvoid}, count::Csize_t, elem::Int32,
                               op::Int32, device::Int32, user::Ptr{Cvoid})::Cint
    return run_collective(user) do state
        T, o, n = comm_eltype(elem), comm_op(op), Int(count)
        on_device(device) && return device_call(state, :reduce_scatter, send, recv, n, T, o)
        state.collectives.reduce_scatter(wrap(T, recv, n), wrap(T, send, state.collectives.size * n), o)
    end
end

function custom_allgather(send::Ptr{Cvoid}, recv::Ptr{Cvoid}, count::Csize_t, elem::Int32,
                          device::Int32, user::Ptr{Cvoid})::Cint
    return run_collective(user) do state
        T, n = comm_eltype(elem), Int(count)
        on_device(device) && return device_call(state, :allgather, send, recv, n, T, nothing)
        state.collectives.allgather(wrap(T, recv, state.collectives.size * n), wrap(T, send, n))
    end
end

function custom_alltoall(send::Ptr{Cvoid}, recv::Ptr{Cvoid}, count::Csize_t, elem::Int32,
                         device::Int32, user::Ptr{Cvoid})::Cint
    return run_collective(user) do state
        T, n = comm_eltype(elem), Int(count)
        on_device(device) && return device_call(state, :alltoall, send, recv, n, T, nothing)
        total = state.collectives.size * n
        state.collectives.alltoall(wrap(T, recv, total), wrap(T, send, total))
    end
end

# The text stays valid until the next failure replaces state.message.
function custom_error_message(code::Cint, user::Ptr{Cvoid})::Ptr{UInt8}
    state = unsafe_pointer_to_objref(user)::CustomState
    return isempty(state.message) ? Ptr{UInt8}(C_NULL) : pointer(state.message)
end

# Called by dsopt_comm_destroy (from close or the finalizer): the state may be
# collected once the Communicator that keeps it is. Allocates nothing.
function custom_release(user::Ptr{Cvoid})::Cvoid
    (unsafe_pointer_to_objref(user)::CustomState).released = true
    return nothing
end

"""
    custom_communicator(collectives::Collectives; stream::Ptr=C_NULL)

A communicator whose collectives are the caller's own Julia functions (see
[`Collectives`](@ref), which shows MPI.jl plugged in): `dsopt_comm_create_custom`
with `@cfunction` callbacks. `stream` is the CUDA stream (`cudaStream_t`)
dsopt's device work runs on for `"device": "cuda"` (`C_NULL`: the legacy
default stream), valid until the communicator is closed. Not collective.
`close(comm)` (or the finalizer) releases it; like any communicator it must
outlive the optimizers on it, which multi-rank code closes on every rank.
Throws a [`DsoptError`](@ref) with code `Dsopt.DSOPT_EINVAL` for a rank or
size out of range.
"""
function custom_communicator(collectives::Collectives; stream::Ptr=C_NULL)
    state = CustomState(collectives, Ptr{Cvoid}(stream), UInt8[], false)
    ops = Ref(CCommOps(
        UInt32(sizeof(CCommOps)),
        UInt32(0),
        Int32(collectives.rank),
        Int32(collectives.size),
        Ptr{Cvoid}(stream),
        @cfunction(custom_allreduce, Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32, Int32, Int32, Ptr{Cvoid})),
        @cfunction(custom_reduce_scatter, Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32, Int32, Int32, Ptr{Cvoid})),
        @cfunction(custom_allgather, Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32, Int32, Ptr{Cvoid})),
        @cfunction(custom_alltoall, Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Csize_t, Int32, Int32, Ptr{Cvoid})),
        @cfunction(custom_error_message, Ptr{UInt8}, (Cint, Ptr{Cvoid})),
        @cfunction(custom_release, Cvoid, (Ptr{Cvoid},))))
    # dsopt copies *ops; `state` is kept by the Communicator (keep) until it is
    # destroyed. When the creation fails dsopt never calls release, and
    # `state` is simply collected.
    return Communicator(:custom, state, out -> GC.@preserve(state,
        ccall((:dsopt_comm_create_custom, libdsopt), Cint,
              (Ref{Ptr{Cvoid}}, Ref{CCommOps}, Ptr{Cvoid}),
              out, ops, pointer_from_objref(state))))
end

function live(comm::Communicator)
    (comm.handle == C_NULL || comm.close_requested) &&
        throw(ArgumentError("dsopt: the communicator is closed"))
    return comm.handle
end

"This process's rank in `comm` (0-based, as MPI numbers ranks)."
comm_rank(comm::Communicator) = Int(ccall((:dsopt_comm_rank, libdsopt), Cint, (Ptr{Cvoid},), live(comm)))

"Number of ranks in `comm`."
comm_size(comm::Communicator) = Int(ccall((:dsopt_comm_size, libdsopt), Cint, (Ptr{Cvoid},), live(comm)))

function destroy!(comm::Communicator)
    handle, comm.handle = comm.handle, C_NULL
    handle == C_NULL || ccall((:dsopt_comm_destroy, libdsopt), Cvoid, (Ptr{Cvoid},), handle)
    release_nodes!(comm)
    return nothing
end

"""
    set_nodes!(comm, node, rail)
    set_nodes!(comm, nothing, nothing)

Gives dsopt the node and rail communicators of `comm`
(`dsopt_comm_set_nodes`): `node` holds the ranks of this rank's node ranked
by local index (R ranks), `rail` the ranks of its local index, one per node,
ranked by node (N ranks), N * R the size of `comm`. Optimizers created on
`comm` afterwards take their topology from them and, where the config's
"topology" "hierarchy" makes them node-aware, run the 1-bit optimizers'
compressed collectives on them (how custom communicators, which dsopt
cannot split, run node-aware). Both stay open while `comm` is (`close` on
them waits for it). `nothing, nothing` forgets them. Throws `DsoptError`
(`DSOPT_EINVAL`) for communicators that cannot be `comm`'s; the layout is
checked when an optimizer is created.
"""
function set_nodes!(comm::Communicator, node::Union{Communicator,Nothing},
                    rail::Union{Communicator,Nothing})
    (node === nothing) == (rail === nothing) ||
        throw(ArgumentError("dsopt: set_nodes! takes both node and rail, or neither"))
    if node === nothing
        @check ccall((:dsopt_comm_set_nodes, libdsopt), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                     live(comm), C_NULL, C_NULL)
    else
        @check ccall((:dsopt_comm_set_nodes, libdsopt), Cint, (Ptr{Cvoid}, Ptr{Cvoid}, Ptr{Cvoid}),
                     live(comm), live(node), live(rail))
        node.users += 1
        rail.users += 1
    end
    release_nodes!(comm)
    comm.nodes = node === nothing ? nothing : (node, rail)
    return comm
end

function release_nodes!(comm::Communicator)
    nodes, comm.nodes = comm.nodes, nothing
    nodes === nothing && return nothing
    for c in nodes
        c.users -= 1
        c.close_requested && c.users == 0 && destroy!(c)
    end
    return nothing
end

function Base.close(comm::Communicator)
    comm.close_requested = true
    comm.users == 0 && destroy!(comm)
    return nothing
end

function Base.show(io::IO, comm::Communicator)
    if comm.handle == C_NULL || comm.close_requested
        print(io, "Dsopt.Communicator(", comm.kind, ", closed)")
    else
        print(io, "Dsopt.Communicator(", comm.kind, ", rank ", comm_rank(comm), " of ", comm_size(comm), ")")
    end
end

# ---- the optimizer -------------------------------------------------------------

# The C dsopt_step_info (80 bytes); struct_size tells dsopt which fields exist.
struct CStepInfo
    struct_size::UInt32
    skipped::Int32
    compressed::Int32
    reserved::Int32
    step::Int64
    loss_scale::Float64
    grad_norm::Float64
    bytes_sent::UInt64
    consecutive_skips::Int64
    phase::Int32
    reserved2::Int32
    grads_replicated::Int32
    diverging::Int32
    bytes_inter_node::UInt64
end

"""
What one [`step!`](@ref) did: whether it was `skipped` (a non-finite gradient
on some rank) or `compressed` (1-bit communication), the number of updates
applied so far (`step`), the `loss_scale` for the next backward pass,
`grad_norm` (`nothing` without clipping or `"report_grad_norm"`), the `bytes_sent` by this rank and
`consecutive_skips` (steps skipped in a row, this one included; 0 when this
step applied) and the `phase`: `PHASE_SKIPPED`, `PHASE_FULL` (full-precision
averaged gradients), `PHASE_COMPRESSED` (1-bit communication), `PHASE_LOCAL`
(a 0/1 Adam local step, no communication) or `PHASE_SYNC` (a 0/1 Adam local
step followed by the 1-bit sync). `grads_replicated`: every rank's local
gradients were bit-identical (and not all zero), so something else had
averaged them already and dsopt averaged them again; checked while the run
has applied fewer than 3 steps, `false` on later steps and at one rank.
`diverging`: the global gradient norm has stayed far above its own recent
history while every value is finite; `true` on every step of such an
episode, the same on every rank (docs/reference/c-api.md "Divergence that stays finite", the
config key `"divergence_check"`). `bytes_inter_node`: the part of
`bytes_sent` sent to ranks of other nodes (the config's `"topology"`).
"""
struct StepInfo
    skipped::Bool
    compressed::Bool
    step::Int64
    loss_scale::Float64
    grad_norm::Union{Float64,Nothing}
    bytes_sent::UInt64
    consecutive_skips::Int64
    phase::Int32
    grads_replicated::Bool
    diverging::Bool
    bytes_inter_node::UInt64
end

# StepInfo.phase (DSOPT_PHASE_* of dsopt.h).
const PHASE_SKIPPED = Int32(0)
const PHASE_FULL = Int32(1)
const PHASE_COMPRESSED = Int32(2)
const PHASE_LOCAL = Int32(3)
const PHASE_SYNC = Int32(4)

"""
    Optimizer(config::String, params::Vector, comm=nothing; groups=nothing)

A dsopt optimizer over `params`: contiguous arrays of `Float32`, `Float16`
or `BFloat16` (or [`BF16Bits`](@ref)), updated in place by [`step!`](@ref).
`config` is the JSON text (DeepSpeed's schema where it overlaps). `comm`
defaults to a local communicator owned by the optimizer. `groups`, one per
parameter, are 1-based indices into the config's `"param_groups"`.

Creating, `step!`, `state_load!` and `close` are collective over `comm`.
The optimizer keeps the arrays and the communicator referenced while it
exists. A finalizer destroys optimizers on a local communicator; multi-rank
code must `close(opt)` on every rank (destroy is collective, and the
garbage collector does not run at the same point on every rank).
"""
mutable struct Optimizer
    handle::Ptr{Cvoid}
    params::Vector{Any}
    groups::Vector{Int32}  # 0-based, as dsopt_tensor.group
    comm::Communicator
    owns_comm::Bool

    function Optimizer(config::AbstractString, params::AbstractVector,
                       comm::Union{Communicator,Nothing}=nothing; groups=nothing)
        groups === nothing || length(groups) == length(params) ||
            throw(ArgumentError("dsopt: $(length(groups)) groups for $(length(params)) parameters"))
        kept = collect(Any, params)
        codes = Int32[groups === nothing ? 0 : groups[i] - 1 for i in eachindex(kept)]
        tensors = CTensor[ctensor(p, "params[$i]", codes[i]) for (i, p) in enumerate(kept)]
        owns_comm = comm === nothing
        c = owns_comm ? Communicator() : comm
        out = Ref{Ptr{Cvoid}}(C_NULL)
        try
            GC.@preserve kept tensors begin
                @check ccall((:dsopt_create, libdsopt), Cint,
                             (Ref{Ptr{Cvoid}}, Cstring, Ptr{Cvoid}, Ptr{CTensor}, Int64),
                             out, config, live(c), tensors, length(tensors))
            end
        catch
            owns_comm && close(c)
            rethrow()
        end
        c.users += 1
        opt = new(out[], kept, codes, c, owns_comm)
        return finalizer(finalize_optimizer, opt)
    end
end

function finalize_optimizer(opt::Optimizer)
    opt.comm.kind === :local && close(opt)
    return nothing
end

function live(opt::Optimizer)
    opt.handle == C_NULL && throw(ArgumentError("dsopt: the optimizer is closed"))
    return opt.handle
end

"""
    close(opt::Optimizer)

Destroys the optimizer (collective); closing twice is fine.
"""
function Base.close(opt::Optimizer)
    handle, opt.handle = opt.handle, C_NULL
    handle == C_NULL && return nothing
    ccall((:dsopt_destroy, libdsopt), Cvoid, (Ptr{Cvoid},), handle)
    comm = opt.comm
    comm.users -= 1
    if opt.owns_comm
        close(comm)
    elseif comm.close_requested && comm.users == 0
        destroy!(comm)
    end
    return nothing
end

"""
    step!(opt, grads) -> StepInfo

One optimizer step with this rank's local gradients: one array per
parameter, in order, same length (dtypes may differ from the parameters').
Gradients are only read, during the call. Collective. `nothing` in place of
an array is an absent gradient (a frozen parameter): ranks without one
contribute zeros; Adam/AdamW leave a parameter that no rank has a gradient
for untouched, step count included; the 1-bit optimizers step it with zeros.

A step with Inf/NaN gradients on some rank is skipped on every rank
(`skipped`, `consecutive_skips`). When the run stops progressing
(`"max_consecutive_skips"` skips in a row, default 50; or an fp16 overflow
at `min_loss_scale`; `"max_consecutive_skips": 0` turns both checks off)
that skipped step throws a [`DsoptError`](@ref)
with code `Dsopt.DSOPT_ENONFINITE`; the next `step!` may continue.
"""
function step!(opt::Optimizer, grads::AbstractVector)
    tensors = CTensor[g === nothing ? CTensor(C_NULL, 0, 0, 0) : ctensor(g, "grads[$i]", 0)
                      for (i, g) in enumerate(grads)]
    info = Ref(CStepInfo(sizeof(CStepInfo), 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0))
    GC.@preserve grads tensors begin
        @check ccall((:dsopt_step, libdsopt), Cint,
                     (Ptr{Cvoid}, Ptr{CTensor}, Int64, Ref{CStepInfo}),
                     live(opt), tensors, length(tensors), info)
    end
    return step_info(info[])
end

"""
    step!(opt) -> StepInfo

Completes a step whose gradients were handed over with
[`grad_ready!`](@ref) (`dsopt_step(opt, NULL, 0, info)`). Collective: every
rank calls it, whatever it handed over. Reports and throws like
`step!(opt, grads)`; a reduction's communication error surfaces here.
`step!(opt, grads)` while gradients are handed over throws a
[`DsoptError`](@ref) with code `Dsopt.DSOPT_EINVAL`.
"""
function step!(opt::Optimizer)
    info = Ref(CStepInfo(sizeof(CStepInfo), 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0))
    @check ccall((:dsopt_step, libdsopt), Cint,
                 (Ptr{Cvoid}, Ptr{CTensor}, Int64, Ref{CStepInfo}),
                 live(opt), C_NULL, 0, info)
    return step_info(info[])
end

"""
    rebind_params!(opt, params)

Points the optimizer at new arrays for its parameters
(`dsopt_rebind_params`): every parameter again, in order, with the length,
element type and group it was created with. Nothing else changes: the next
`step!` updates the new arrays in place (fp32 masters of 16-bit parameters
stay dsopt's), so a run whose values were copied into them continues
bit-identically. The optimizer then keeps the new arrays referenced instead
of the old ones. Not collective. Another count, length, element type or
group, or gradients being handed over, throw a [`DsoptError`](@ref) with
code `Dsopt.DSOPT_EINVAL` and change nothing.
"""
function rebind_params!(opt::Optimizer, params::AbstractVector)
    handle = live(opt)
    kept = collect(Any, params)
    tensors = CTensor[ctensor(p, "params[$i]", get(opt.groups, i, Int32(0)))
                      for (i, p) in enumerate(kept)]
    GC.@preserve kept tensors begin
        @check ccall((:dsopt_rebind_params, libdsopt), Cint, (Ptr{Cvoid}, Ptr{CTensor}, Int64),
                     handle, tensors, length(tensors))
    end
    opt.params = kept
    return opt
end

step_info(i::CStepInfo) =
    StepInfo(i.skipped != 0, i.compressed != 0, i.step, i.loss_scale,
             i.grad_norm < 0 ? nothing : i.grad_norm, i.bytes_sent,
             i.consecutive_skips, i.phase, i.grads_replicated != 0, i.diverging != 0,
             i.bytes_inter_node)

"""
    grad_ready!(opt, index, grad)

Hands over parameter `index`'s (1-based) local gradient of one micro-batch
(`dsopt_grad_ready`), typically while backward is still producing the
others, so that its reduction overlaps the rest of backward; `step!(opt)`
then completes the step. Not collective (`step!` is).

`grad` is an array as `step!` takes one, with the parameter's length (any
dtype), and is read completely before the call returns: the buffer may be
reused at once. Any order, which may differ between ranks. With
`"gradient_accumulation_steps"` = G each parameter is handed over G times per
step, once per micro-batch, and the step uses the mean of the G gradients; a
parameter not handed over in a micro-batch contributes zeros.

Throws a [`DsoptError`](@ref) with code `Dsopt.DSOPT_EINVAL` (nothing
changes) for an index out of range, a length or dtype that does not fit, or
a parameter already handed over G times in this step.
"""
function grad_ready!(opt::Optimizer, index::Integer, grad)
    handle = live(opt)
    tensor = Ref(ctensor(grad, "grad", 0))
    GC.@preserve grad begin
        @check ccall((:dsopt_grad_ready, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ref{CTensor}),
                     handle, index - 1, tensor)
    end
    return opt
end

"Sets the learning rate of every parameter group."
set_lr!(opt::Optimizer, lr::Real) =
    @check ccall((:dsopt_set_lr, libdsopt), Cint, (Ptr{Cvoid}, Cdouble), live(opt), lr)

"Sets `\"gradient_clipping\"` (the global gradient norm's limit; 0: off) from the next step on."
set_gradient_clipping!(opt::Optimizer, max_norm::Real) =
    @check ccall((:dsopt_set_gradient_clipping, libdsopt), Cint, (Ptr{Cvoid}, Cdouble),
                 live(opt), max_norm)

"The CPU threads of the optimizer's host work: `\"threads\"`, or by default this rank's share of its cores."
function threads(opt::Optimizer)
    out = Ref{Int32}(0)
    @check ccall((:dsopt_get_threads, libdsopt), Cint, (Ptr{Cvoid}, Ref{Int32}), live(opt), out)
    return Int(out[])
end

"The current `\"gradient_clipping\"` (0.0: off)."
function gradient_clipping(opt::Optimizer)
    out = Ref{Cdouble}(0)
    @check ccall((:dsopt_get_gradient_clipping, libdsopt), Cint, (Ptr{Cvoid}, Ref{Cdouble}),
                 live(opt), out)
    return out[]
end

"Sets the learning rate of parameter group `group` (1-based)."
set_group_lr!(opt::Optimizer, group::Integer, lr::Real) =
    @check ccall((:dsopt_set_group_lr, libdsopt), Cint, (Ptr{Cvoid}, Int32, Cdouble),
                 live(opt), group - 1, lr)

"""
    group_param_names(optimizer_type) -> Vector{Tuple{String,String}}

The group hyperparameters of the algorithm `optimizer_type` (a config's
"optimizer.type", any case or alias), each with its config key, in order:
`("lr", "lr")`, `("beta1", "betas")`, ... (a key named more than once is a
list of those values). The names are those `group_param` accepts.
"""
function group_param_names(optimizer_type::AbstractString)
    names = Ref{Cstring}(C_NULL)
    keys = Ref{Cstring}(C_NULL)
    @check ccall((:dsopt_group_param_names, libdsopt), Cint,
                 (Cstring, Ref{Cstring}, Ref{Cstring}), optimizer_type, names, keys)
    return [(String(n), String(k))
            for (n, k) in zip(split(unsafe_string(names[])), split(unsafe_string(keys[])))]
end

# ---- what an algorithm is -------------------------------------------------------

# dsopt_algorithm_info.flags and .hyper_ranges (include/dsopt.h)
const DSOPT_ALGORITHM_PARAM_STEPS = UInt32(1)
const DSOPT_ALGORITHM_ZERO        = UInt32(2)
const DSOPT_ALGORITHM_OFFLOAD     = UInt32(4)
const DSOPT_ALGORITHM_COMPRESSED  = UInt32(8)
const HYPER_RANGES = Dict(Int32(0) => :beta, Int32(1) => :nonnegative, Int32(2) => :flag)

# The C dsopt_algorithm_info (88 bytes on 64-bit targets); every pointer is
# static (the strings NUL-terminated). struct_size tells dsopt which fields exist.
struct CAlgorithmInfo
    struct_size::UInt32
    flags::UInt32
    type::Ptr{UInt8}
    aliases::Ptr{UInt8}
    moments::Int32
    num_hyper::Int32
    moment_names::Ptr{UInt8}
    hyper_names::Ptr{UInt8}
    hyper_keys::Ptr{UInt8}
    hyper_defaults::Ptr{Cdouble}
    hyper_ranges::Ptr{Int32}
    keys::Ptr{UInt8}
    group_keys::Ptr{UInt8}
end

# A static, NUL-terminated, space-separated list of words.
words(list) = String.(split(unsafe_string(list)))

"""
    algorithm_names() -> Vector{String}

The types of the algorithms the loaded library has, in the registry's order
(`dsopt_algorithm_names`).
"""
function algorithm_names()
    names = Ref{Cstring}(C_NULL)
    @check ccall((:dsopt_algorithm_names, libdsopt), Cint, (Ref{Cstring},), names)
    return words(names[])
end

"""
What an algorithm is, as the library's registry describes it
([`describe`](@ref)): its canonical `type`, `aliases`, the state view names
of its fp32 moments (`moment_names`), its group `hyperparameters` (lr
first) as named tuples `(name, key, default, range)` (`range` `:beta`,
`:nonnegative` or `:flag`; a key of several hyperparameters, as "betas", is
a list of their values), the other `keys` of `optimizer.params` and
`group_keys` of `param_groups[i]`, and its `flags`:
[`param_steps`](@ref), [`supports_zero`](@ref), [`offload`](@ref),
[`compressed`](@ref).
"""
struct Algorithm
    type::String
    aliases::Vector{String}
    moment_names::Vector{String}
    hyperparameters::Vector{NamedTuple{(:name, :key, :default, :range),
                                       Tuple{String,String,Float64,Symbol}}}
    keys::Vector{String}
    group_keys::Vector{String}
    flags::UInt32
end

Base.:(==)(a::Algorithm, b::Algorithm) =
    all(getfield(a, f) == getfield(b, f) for f in fieldnames(Algorithm))

"Parameters count their own steps (`param_step`); each parameter's state stands alone."
param_steps(a::Algorithm) = a.flags & DSOPT_ALGORITHM_PARAM_STEPS != 0
"Runs under ZeRO stage 1/2, compressed ZeRO included."
supports_zero(a::Algorithm) = a.flags & DSOPT_ALGORITHM_ZERO != 0
"Its ZeRO shard can live in host memory (\"offload_optimizer\")."
offload(a::Algorithm) = a.flags & DSOPT_ALGORITHM_OFFLOAD != 0
"1-bit compressed communication after a warmup (error feedback, stages, momentum masks)."
compressed(a::Algorithm) = a.flags & DSOPT_ALGORITHM_COMPRESSED != 0

"""
    describe(optimizer_type) -> Algorithm

What the algorithm `optimizer_type` (a config's "optimizer.type", any case
or alias) is (`dsopt_algorithm_describe`). An unknown type is a
`DsoptError` (`DSOPT_EINVAL`).
"""
function describe(optimizer_type::AbstractString)
    blank = CAlgorithmInfo(UInt32(sizeof(CAlgorithmInfo)), 0, C_NULL, C_NULL, 0, 0, C_NULL,
                           C_NULL, C_NULL, C_NULL, C_NULL, C_NULL, C_NULL)
    info = Ref(blank)
    @check ccall((:dsopt_algorithm_describe, libdsopt), Cint, (Cstring, Ref{CAlgorithmInfo}),
                 optimizer_type, info)
    c = info[]
    names, keys = words(c.hyper_names), words(c.hyper_keys)
    hyper = [(name = names[i], key = keys[i], default = unsafe_load(c.hyper_defaults, i),
              range = HYPER_RANGES[unsafe_load(c.hyper_ranges, i)]) for i in 1:c.num_hyper]
    return Algorithm(unsafe_string(c.type), words(c.aliases), words(c.moment_names), hyper,
                     words(c.keys), words(c.group_keys), c.flags)
end

"""
    group_param(opt, group, name) -> Float64

A hyperparameter of parameter group `group` (1-based) by name: the
algorithm's (`group_param_names`), e.g. "lr", "beta1", "beta2", "eps" or
"weight_decay" for Adam.
"""
function group_param(opt::Optimizer, group::Integer, name::AbstractString)
    value = Ref{Cdouble}(0)
    @check ccall((:dsopt_get_group_param, libdsopt), Cint,
                 (Ptr{Cvoid}, Int32, Cstring, Ref{Cdouble}), live(opt), group - 1, name, value)
    return value[]
end

"Sets a hyperparameter of group `group` (1-based) from the next step on."
set_group_param!(opt::Optimizer, group::Integer, name::AbstractString, value::Real) =
    @check ccall((:dsopt_set_group_param, libdsopt), Cint, (Ptr{Cvoid}, Int32, Cstring, Cdouble),
                 live(opt), group - 1, name, value)

"Updates applied to parameter `i` (1-based; torch.optim's `state[\"step\"]`)."
function param_step(opt::Optimizer, i::Integer)
    step = Ref{Int64}(0)
    @check ccall((:dsopt_get_param_step, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ref{Int64}),
                 live(opt), i - 1, step)
    return step[]
end

"Sets parameter `i`'s step count (1-based; Adam/AdamW)."
set_param_step!(opt::Optimizer, i::Integer, step::Integer) =
    @check ccall((:dsopt_set_param_step, libdsopt), Cint, (Ptr{Cvoid}, Int64, Int64),
                 live(opt), i - 1, step)

# ---- the deferred parameter allgather (ZeRO, "deferred_allgather") ---------------

"Buckets of ZeRO's parameter allgather (0 where parameters are never gathered)."
function gather_buckets(opt::Optimizer)
    n = Ref{Int64}(0)
    @check ccall((:dsopt_gather_num_buckets, libdsopt), Cint, (Ptr{Cvoid}, Ref{Int64}), live(opt), n)
    return Int(n[])
end

"The bucket (1-based) after which parameter `i` (1-based) is whole; 0 when it is never gathered."
function gather_bucket_of(opt::Optimizer, i::Integer)
    b = Ref{Int64}(0)
    @check ccall((:dsopt_gather_bucket_of, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ref{Int64}),
                 live(opt), i - 1, b)
    return Int(b[]) + 1
end

"""
    set_gather_order!(opt, order = Int[])

Collective: the order (1-based parameter indices, each once; empty: the
default, parameter order) in which the caller needs the parameters, e.g. the
model's forward order. From the next step on the deferred allgather posts
its buckets in the order these parameters first need them, and
`gather_bucket_of` and `wait_gather_bucket!` number buckets by that
position; values and state are the same whatever the order. Every rank
passes the same order (`dsopt_gather_order`).
"""
function set_gather_order!(opt::Optimizer, order::AbstractVector{<:Integer} = Int[])
    zero_based = Int64[i - 1 for i in order]
    @check ccall((:dsopt_gather_order, libdsopt), Cint, (Ptr{Cvoid}, Ptr{Int64}, Int64),
                 live(opt), isempty(zero_based) ? C_NULL : zero_based, length(zero_based))
    return nothing
end

"Buckets of the last step's deferred allgather not arrived yet (does not wait)."
function gathers_pending(opt::Optimizer)
    n = Ref{Int64}(0)
    @check ccall((:dsopt_gather_pending, libdsopt), Cint, (Ptr{Cvoid}, Ref{Int64}), live(opt), n)
    return Int(n[])
end

"""
    wait_gather!(opt, i = 0)

Waits until parameter `i` (1-based; 0: every parameter) is whole after a step
with `"deferred_allgather"`. Every other call waits for all buckets itself.
"""
wait_gather!(opt::Optimizer, i::Integer = 0) =
    @check ccall((:dsopt_gather_wait, libdsopt), Cint, (Ptr{Cvoid}, Int64), live(opt), i - 1)

"Waits until buckets 1 .. `b` have arrived (0: every bucket)."
wait_gather_bucket!(opt::Optimizer, b::Integer = 0) =
    @check ccall((:dsopt_gather_wait_bucket, libdsopt), Cint, (Ptr{Cvoid}, Int64), live(opt), b - 1)

"Learning rate of parameter group `group` (1-based)."
function group_lr(opt::Optimizer, group::Integer)
    lr = Ref{Cdouble}(0)
    @check ccall((:dsopt_get_lr, libdsopt), Cint, (Ptr{Cvoid}, Int32, Ref{Cdouble}),
                 live(opt), group - 1, lr)
    return lr[]
end

"Number of parameter groups."
function num_groups(opt::Optimizer)
    count = Ref{Int32}(0)
    @check ccall((:dsopt_num_groups, libdsopt), Cint, (Ptr{Cvoid}, Ref{Int32}), live(opt), count)
    return Int(count[])
end

"Scale to multiply the next loss by (1.0 without loss scaling)."
function loss_scale(opt::Optimizer)
    scale = Ref{Cdouble}(0)
    @check ccall((:dsopt_get_loss_scale, libdsopt), Cint, (Ptr{Cvoid}, Ref{Cdouble}), live(opt), scale)
    return scale[]
end

"""
    set_momentum_mask!(opt, index, mask)

Sets the momentum mask of parameter `index` (1-based) for 1-bit optimizers:
a `Float32` array with the parameter's length, multiplied into the momentum
after every compressed step; dsopt keeps a copy. `nothing` clears it.
"""
function set_momentum_mask!(opt::Optimizer, index::Integer, mask::Union{AbstractArray,Nothing})
    handle = live(opt)
    if mask === nothing
        @check ccall((:dsopt_set_momentum_mask, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ptr{CTensor}),
                     handle, index - 1, C_NULL)
    else
        tensor = Ref(ctensor(mask, "mask", 0))
        GC.@preserve mask begin
            @check ccall((:dsopt_set_momentum_mask, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ref{CTensor}),
                         handle, index - 1, tensor)
        end
    end
    return nothing
end

# The text of a call with dsopt's string-buffer convention: `fill(dst,
# capacity, size)` asked for the size (C_NULL, 0), then filled.
function read_text(fill)
    nbytes = Ref{UInt64}(0)
    @check fill(Ptr{UInt8}(C_NULL), UInt64(0), nbytes)
    buf = Vector{UInt8}(undef, nbytes[])
    @check fill(pointer(buf), UInt64(length(buf)), nbytes)
    return GC.@preserve buf unsafe_string(pointer(buf))
end

"""
    config(opt) -> String

The optimizer's canonical configuration as JSON text (`dsopt_get_config`):
every key with its effective value, defaults filled in, aliases resolved,
the group hyperparameters and gradient clipping as they are now. An
optimizer created from it has the same config.
"""
function config(opt::Optimizer)
    handle = live(opt)
    return read_text((dst, capacity, nbytes) -> ccall((:dsopt_get_config, libdsopt), Cint,
        (Ptr{Cvoid}, Ptr{UInt8}, UInt64, Ref{UInt64}), handle, dst, capacity, nbytes))
end

"""
    canonical_config(text) -> String

The canonical form of a JSON config (`dsopt_config_canonical`): what
[`config`](@ref) of an optimizer created from it returns.
"""
function canonical_config(text::AbstractString)
    return read_text((dst, capacity, nbytes) -> ccall((:dsopt_config_canonical, libdsopt), Cint,
        (Cstring, Ptr{UInt8}, UInt64, Ref{UInt64}), text, dst, capacity, nbytes))
end

"""
    state_save(opt) -> Vector{UInt8}

This rank's whole optimizer state as one self-describing, checksummed blob.
"""
function state_save(opt::Optimizer)
    handle = live(opt)
    nbytes = Ref{UInt64}(0)
    @check ccall((:dsopt_state_size, libdsopt), Cint, (Ptr{Cvoid}, Ref{UInt64}), handle, nbytes)
    blob = Vector{UInt8}(undef, nbytes[])
    written = Ref{UInt64}(0)
    @check ccall((:dsopt_state_save, libdsopt), Cint, (Ptr{Cvoid}, Ptr{UInt8}, UInt64, Ref{UInt64}),
                 handle, blob, length(blob), written)
    return resize!(blob, written[])
end

"""
    state_load!(opt, blob)

Restores a blob from [`state_save`](@ref) into an optimizer made with the
same config and parameter shapes; validated completely before anything
changes. Collective. A blob another rank of this world size saved throws a
[`DsoptError`](@ref) with code `Dsopt.DSOPT_EMISMATCH` on every rank when it
holds state that belongs to that rank (1-bit compression errors, 0/1 Adam's
accumulator, a ZeRO shard); the message says what to load instead.
"""
function state_load!(opt::Optimizer, blob::AbstractVector{UInt8})
    state_load_ex!(opt, blob)
    return opt
end

"""
    state_load_ex!(opt, blob; reset_rank_local=false) -> Bool

[`state_load!`](@ref), and with `reset_rank_local=true` the 1-bit optimizers
load another rank's blob too: its replicated state, with the rank-local state
reset on every rank as a load at another world size does
(`dsopt_state_load_ex` with `DSOPT_LOAD_RESET_RANK_LOCAL`; a ZeRO shard is
still refused). Returns whether rank-local state was reset (the same on
every rank): also where the 1-bit compression errors belong to another world
size or topology (flat or node-aware), which reset. Collective.
"""
function state_load_ex!(opt::Optimizer, blob::AbstractVector{UInt8}; reset_rank_local::Bool=false)
    bytes = blob isa Vector{UInt8} ? blob : Vector{UInt8}(blob)
    flags = reset_rank_local ? DSOPT_LOAD_RESET_RANK_LOCAL : UInt32(0)
    reset = Ref{Int32}(0)
    @check ccall((:dsopt_state_load_ex, libdsopt), Cint,
                 (Ptr{Cvoid}, Ptr{UInt8}, UInt64, UInt32, Ref{Int32}),
                 live(opt), bytes, length(bytes), flags, reset)
    return reset[] != 0
end

"""
    state_load_shards!(opt, blobs)

Restores the state of a run saved at any world size from the blobs all of
its ranks wrote with [`state_save`](@ref): `blobs[i]` is the blob of old
rank `i - 1` (ranks are 0-based), and every rank passes all of them in the
same order. Collective.

Adam and AdamW at any ZeRO stage (`"zero_optimization": {"stage": 1 or 2}`)
reshard: the old run's ZeRO shards, or its replicated stage-0 state, are cut
into this rank's shard, so a run saved on 2 ranks continues on 4, or a
stage-0 run continues at stage 2, as an uninterrupted run at the new size
would. The other optimizers have replicated state and load as
[`state_load!`](@ref) does. A single blob (the blob of a one-rank run, or
one replica of replicated state) is a complete set.

Every blob is validated before anything changes. An empty `blobs` throws
`ArgumentError`; a damaged blob a [`DsoptError`](@ref) with code
`Dsopt.DSOPT_ECORRUPT`; another algorithm or shapes, a missing, duplicated
or misordered blob, or blobs of different runs or steps `Dsopt.DSOPT_EMISMATCH`.
"""
function state_load_shards!(opt::Optimizer, blobs::AbstractVector)
    handle = live(opt)
    isempty(blobs) &&
        throw(ArgumentError("dsopt: state_load_shards! needs at least one blob " *
                            "(one per rank of the saved run)"))
    bytes = Vector{Vector{UInt8}}(undef, length(blobs))
    for (i, blob) in enumerate(blobs)
        blob isa AbstractVector{UInt8} ||
            throw(ArgumentError("dsopt: blobs[$i] must be a vector of UInt8, got $(typeof(blob))"))
        bytes[i] = blob isa Vector{UInt8} ? blob : Vector{UInt8}(blob)
    end
    GC.@preserve bytes begin
        pointers = Ptr{Cvoid}[pointer(b) for b in bytes]
        sizes = UInt64[length(b) for b in bytes]
        @check ccall((:dsopt_state_load_shards, libdsopt), Cint,
                     (Ptr{Cvoid}, Ptr{Ptr{Cvoid}}, Ptr{UInt64}, Int64),
                     handle, pointers, sizes, length(bytes))
    end
    return opt
end

"""
    memory_usage(opt) -> (host = bytes, device = bytes)

Bytes of the buffers dsopt holds for this optimizer on this rank: state
(moments, fp32 masters, ZeRO shards), gradient and communication buffers,
in host memory and in device memory. The parameters and gradients passed
in are not counted. Not collective.
"""
function memory_usage(opt::Optimizer)
    host, device = Ref{UInt64}(0), Ref{UInt64}(0)
    @check ccall((:dsopt_memory_usage, libdsopt), Cint, (Ptr{Cvoid}, Ref{UInt64}, Ref{UInt64}),
                 live(opt), host, device)
    return (host = Int(host[]), device = Int(device[]))
end

"""
    state_memory_usage(opt) -> (host = bytes, device = bytes)

The part of `memory_usage` that is state the blob saves (moments, fp32
masters, compression errors); the rest are gradient, scratch and
communication buffers. Not collective.
"""
function state_memory_usage(opt::Optimizer)
    host, device = Ref{UInt64}(0), Ref{UInt64}(0)
    @check ccall((:dsopt_state_memory_usage, libdsopt), Cint,
                 (Ptr{Cvoid}, Ref{UInt64}, Ref{UInt64}), live(opt), host, device)
    return (host = Int(host[]), device = Int(device[]))
end

function Base.show(io::IO, opt::Optimizer)
    state = opt.handle == C_NULL ? "closed" : "$(length(opt.params)) params"
    print(io, "Dsopt.Optimizer(", state, ")")
end

# ---- codecs (dsopt_codec) ------------------------------------------------------
#
# UNTESTED, as the rest of this file. CCodecOptions mirrors
# `dsopt_codec_options` of include/dsopt.h field for field: uint32, int32,
# int64, int32, int32, a pointer (32 bytes on 64-bit targets, no padding).

struct CCodecOptions
    struct_size::UInt32   # sizeof(dsopt_codec_options)
    device::Int32         # DSOPT_COMM_HOST
    block::Int64          # 0: the default, 64
    threads::Int32        # 0: OpenMP's count
    reserved::Int32
    stream::Ptr{Cvoid}    # struct CUstream_st * (unused on host)
end

@assert sizeof(CCodecOptions) == 24 + sizeof(Ptr{Cvoid}) &&
        fieldoffset(CCodecOptions, 3) == 8 "CCodecOptions does not match dsopt_codec_options"

"""
    Codec(name; block=0, threads=0)

Compressed ZeRO's codes for collectives of the caller's own (`dsopt_codec`,
docs/reference/c-api.md "Codecs"), on host memory: `name` is "int8",
"int4", "sign" (an fp32 scale per block of `block` elements, 0 meaning 64;
with an error-feedback residual) or "bf16" (no blocks, no residual).
[`encode!`](@ref) and [`decode_sum!`](@ref) write the library's bytes, bit
for bit. `close(codec)` frees it; a finalizer does too. Not collective.
"""
mutable struct Codec
    handle::Ptr{Cvoid}
    name::String

    function Codec(name::AbstractString; block::Integer=0, threads::Integer=0)
        options = Ref(CCodecOptions(UInt32(sizeof(CCodecOptions)), DSOPT_COMM_HOST, Int64(block),
                                    Int32(threads), Int32(0), C_NULL))
        out = Ref{Ptr{Cvoid}}(C_NULL)
        @check ccall((:dsopt_codec_create, libdsopt), Cint,
                     (Ref{Ptr{Cvoid}}, Cstring, Ref{CCodecOptions}), out, name, options)
        return finalizer(close, new(out[], String(name)))
    end
end

function Base.close(codec::Codec)
    if codec.handle != C_NULL
        ccall((:dsopt_codec_destroy, libdsopt), Cvoid, (Ptr{Cvoid},), codec.handle)
        codec.handle = C_NULL
    end
    return nothing
end

live(codec::Codec) = codec.handle == C_NULL ? throw(ArgumentError("dsopt: the codec is closed")) :
                     codec.handle

"Bytes of the code of one run of `n` values."
function encoded_size(codec::Codec, n::Integer)
    bytes = Ref{UInt64}(0)
    @check ccall((:dsopt_codec_encoded_size, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ref{UInt64}),
                 live(codec), n, bytes)
    return Int(bytes[])
end

"Bytes of the error-feedback residual of one run of `n` values (zeros: the zero residual)."
function residual_size(codec::Codec, n::Integer)
    bytes = Ref{UInt64}(0)
    @check ccall((:dsopt_codec_residual_size, libdsopt), Cint, (Ptr{Cvoid}, Int64, Ref{UInt64}),
                 live(codec), n, bytes)
    return Int(bytes[])
end

"""
    encode!(codec, dst::Vector{UInt8}, values::AbstractVector{Float32}; runs=1, residual=nothing)

The codes of `runs` runs of `length(values) ÷ runs` values each, back to
back, into `dst`; with `residual` (a `Vector{UInt8}` of `runs` residual
runs) error feedback, the residual updated in place. Returns `dst`.
"""
function encode!(codec::Codec, dst::Vector{UInt8}, values::AbstractVector{Float32};
                 runs::Integer=1, residual::Union{Nothing,Vector{UInt8}}=nothing)
    t = ctensor(values, "values", 0)
    e = residual === nothing ? UInt8[] : residual
    GC.@preserve values dst e begin
        @check ccall((:dsopt_codec_encode, libdsopt), Cint,
                     (Ptr{Cvoid}, Ref{CTensor}, Int64, Ptr{Cvoid}, UInt64, Ptr{Cvoid}, UInt64),
                     live(codec), t, runs, residual === nothing ? C_NULL : pointer(e), length(e),
                     pointer(dst), length(dst))
    end
    return dst
end

"The codes of `values` in a new vector (see [`encode!`](@ref))."
encode(codec::Codec, values::AbstractVector{Float32}; runs::Integer=1, residual=nothing) =
    encode!(codec, Vector{UInt8}(undef, runs * encoded_size(codec, length(values) ÷ runs)), values;
            runs=runs, residual=residual)

"""
    decode_sum!(codec, out::AbstractVector{Float32}, codes::Vector{UInt8}; runs=1)

`out[i]` = the sum over the `runs` codes of `length(out)` values each that
`codes` holds, in run order, of their decoded element `i`. Returns `out`.
"""
function decode_sum!(codec::Codec, out::AbstractVector{Float32}, codes::Vector{UInt8}; runs::Integer=1)
    t = ctensor(out, "out", 0)
    GC.@preserve out codes begin
        @check ccall((:dsopt_codec_decode_sum, libdsopt), Cint,
                     (Ptr{Cvoid}, Ptr{Cvoid}, UInt64, Int64, Ref{CTensor}),
                     live(codec), pointer(codes), length(codes), runs, t)
    end
    return out
end

Base.show(io::IO, codec::Codec) =
    print(io, "Dsopt.Codec(", repr(codec.name), codec.handle == C_NULL ? ", closed)" : ")")

end # module
