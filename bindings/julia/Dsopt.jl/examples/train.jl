# Linear regression on generated data, trained with dsopt from Julia: first
# with Adam, then with AdamW under ZeRO stage 2, then with 1-bit Adam (a short
# warmup, then compressed momentum), all on the local communicator. Each run
# reports the memory dsopt holds and reloads its blob with state_load_shards!. Prints the loss falling and exits non-zero
# unless each run ends below 5% of its initial loss.
#
# From the repository root, after building libdsopt into build/:
#     julia --project=bindings/julia/Dsopt.jl bindings/julia/Dsopt.jl/examples/train.jl [steps]

using Dsopt

const FEATURES = 32
const SAMPLES = 1024
const NOISE = 0.05f0
const REQUIRED_LOSS_RATIO = 0.05

# xorshift64* with Box-Muller normals: a fixed data set without packages.
mutable struct XorShift
    state::UInt64
end

function uniform!(r::XorShift)
    r.state ⊻= r.state >> 12
    r.state ⊻= r.state << 25
    r.state ⊻= r.state >> 27
    return ((r.state * 0x2545f4914f6cdd1d) >> 11) / 2.0^53
end

normal!(r::XorShift) = Float32(sqrt(-2 * log(max(uniform!(r), 1e-300))) * cos(2π * uniform!(r)))

# y = x'w* + b* + noise; x is FEATURES x SAMPLES, one sample per column,
# features of different scales.
function generate(seed)
    rng = XorShift(seed)
    scale = Float32[0.2 + 2.0 * (j % 5) for j in 0:FEATURES-1]
    w_true = [normal!(rng) for _ in 1:FEATURES]
    x = Matrix{Float32}(undef, FEATURES, SAMPLES)
    y = Vector{Float32}(undef, SAMPLES)
    for i in 1:SAMPLES
        for j in 1:FEATURES
            x[j, i] = normal!(rng) * scale[j]
        end
        y[i] = sum(x[j, i] * w_true[j] for j in 1:FEATURES) + 0.7f0 + NOISE * normal!(rng)
    end
    return x, y
end

# Mean squared error / 2, and its gradients into gw and gb.
function loss_and_grads!(gw, gb, w, b, x, y)
    fill!(gw, 0)
    gb[1] = 0
    loss = 0.0
    for i in 1:SAMPLES
        r = b[1] - y[i]
        for j in 1:FEATURES
            r += x[j, i] * w[j]
        end
        loss += 0.5 * Float64(r)^2
        for j in 1:FEATURES
            gw[j] += r * x[j, i]
        end
        gb[1] += r
    end
    gw ./= SAMPLES
    gb ./= SAMPLES
    return loss / SAMPLES
end

function train(name, config, x, y, steps)
    println("== $name: $config")
    w, b = zeros(Float32, FEATURES), zeros(Float32, 1)
    gw, gb = similar(w), similar(b)
    opt = Optimizer(config, [w, b])          # w and b are updated in place
    first_loss = last_loss = NaN
    print_every = max(steps ÷ 10, 1)
    try
        for step in 1:steps
            loss = loss_and_grads!(gw, gb, w, b, x, y)
            info = step!(opt, [gw, gb])
            step == 1 && (first_loss = loss)
            last_loss = loss
            if step % print_every == 1 || step == steps
                println("step $(lpad(info.step, 4))  loss $(round(loss; digits=6))  ",
                        "compressed $(Int(info.compressed))  bytes sent $(info.bytes_sent)")
            end
        end
        blob = state_save(opt)
        usage = memory_usage(opt)
        println("state blob: $(length(blob)) bytes; dsopt holds $(usage.host) host bytes, ",
                "$(usage.device) device bytes")
        # A one-rank run's single blob is a complete set for the resharding
        # load (a run saved on P ranks passes its P blobs, in rank order).
        state_load_shards!(opt, [blob])
        state_save(opt) == blob || error("the state after state_load_shards! differs")
    finally
        close(opt)
    end
    return first_loss, last_loss
end

function main(args)
    steps = isempty(args) ? 300 : parse(Int, args[1])
    println("dsopt $(Dsopt.version()): $(Dsopt.build_info())")
    x, y = generate(0x5eed)
    runs = [
        ("Adam", """{"optimizer": {"type": "Adam", "params": {"lr": 0.05}}}"""),
        ("AdamW, ZeRO stage 2", """{"optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0.0}}, "zero_optimization": {"stage": 2, "reduce_bucket_size": 16}}"""),
        ("1-bit Adam", """{"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.05, "freeze_step": $(steps ÷ 5)}}}"""),
    ]
    ok = true
    for (name, config) in runs
        first_loss, last_loss = train(name, config, x, y, steps)
        passed = last_loss < REQUIRED_LOSS_RATIO * first_loss
        println("$name: loss $(round(first_loss; digits=6)) -> $(round(last_loss; digits=6)) ",
                passed ? "(ok)" : "(FAILED)", "\n")
        ok &= passed
    end
    return ok
end

main(ARGS) || exit(1)
