#!/usr/bin/env python3
"""TensorFlow 2 CPU training-throughput benchmark for the same two small CIFAR-10-style CNNs
as torch_cifar_bench.py (tfcnn, resnet20), for comparing against the PyTorch numbers.

Setup (scripts/bench.sh --install-peers does this in build/bench-venv):
    pip install tensorflow-cpu          # written against TF 2.x; TF >= 2.16 brings Keras 3
    python3 tf_cifar_bench.py --model resnet20 --batch 128 --threads 2 --steps 30 --warmup 5 --json
    python3 tf_cifar_bench.py --model resnet20 --batch 128 --threads 2 --towers 2 --steps 30 --warmup 5 --json

Data: synthetic, channels-last NHWC float32 [B,32,32,3] ~ N(0,1) and int64 labels in [0,10),
numpy default_rng(seed); generated once, converted to tensors once, reused every step.

Models (Keras functional API, channels-last, layers from tf.keras; only layers that exist
unchanged in Keras 2 and Keras 3 are used):
  tfcnn    : Conv2D(64,5,'same')+ReLU, MaxPool(3, stride 2, 'same'), Conv2D(64,5,'same')+ReLU,
             MaxPool(3,2,'same'), Flatten (8*8*64 = 4096), Dense 384 ReLU, Dense 192 ReLU,
             Dense 10 (logits). 1,756,426 params, as the PyTorch model.
  resnet20 : Conv2D(16,3,'same',no bias)+BN+ReLU, 3 stages x 3 BasicBlocks (16/32/64 ch, first
             block of stages 2/3 has stride 2), shortcut = 1x1 Conv2D (stride 2, no bias)+BN where
             the shape changes, identity elsewhere; GlobalAveragePooling2D, Dense 10.
             BN: momentum 0.9, epsilon 1e-5 (= PyTorch BatchNorm2d defaults). 272,474 trainable
             params, as the PyTorch model. ('same' padding with stride 2 pads 0 before/1 after
             where PyTorch pads 1/1; output shapes and MACs are identical.)
  Weight init is Keras' default (glorot_uniform / zeros), not PyTorch's; this does not change
  the work done per step.

Training step (one tf.function per step; the Python loop calls it --warmup + --steps times):
  forward (training=True) -> sparse softmax cross-entropy (mean over the global batch) ->
  tape.gradient -> [towers>1: all-reduce SUM of the per-tower gradients] ->
  SGD with momentum 0.9 and weight decay 5e-4 written out by hand, with exactly PyTorch's
  torch.optim.SGD semantics:   g <- g + wd*w ;  buf <- 0.9*buf + g ;  w <- w - lr*buf
  i.e. weight decay is COUPLED L2 (the gradient of (wd/2)*||w||^2 added to the gradient, applied
  to every trainable variable incl. biases and BN gamma/beta, as torch.optim.SGD does), NOT
  AdamW-style decoupled decay. The optimizer is hand-written (tf.Variable momentum buffers,
  assign/assign_sub) so that it behaves the same under Keras 2 and Keras 3.
  Timing: each step is timed with perf_counter around the tf.function call plus loss.numpy()
  (the analogue of PyTorch's loss.item()); median over --steps; img/s = batch / median.

--towers K > 1: K logical CPU devices are carved out of the one physical CPU with
  tf.config.set_logical_device_configuration, and tf.distribute.MirroredStrategy runs one replica
  ("tower") per logical device with cross_device_ops=tf.distribute.ReductionToOneDevice()
  (NCCL all-reduce needs GPUs). The global batch --batch is split evenly across towers; each
  tower's slice is placed on its device once, before timing. Variables (weights, BN statistics,
  momentum buffers) are MirroredVariables; gradients are summed across towers with
  ReplicaContext.all_reduce and every tower applies the same update to its own copy, so the
  copies stay identical. BN statistics are per tower (not synchronized), as in PyTorch DDP.
  Threads: TensorFlow has ONE intra-op thread pool per process, shared by all logical devices:
  --threads T is the size of that pool (T threads split across the K towers, T/K per tower on
  average). The inter-op pool is --inter-op (default K) so that the K towers' ops can run
  concurrently; with K = 1 the default is 1 (ops run one after another, like PyTorch eager).
  Both pools are set with tf.config.threading.* before any TensorFlow op runs.

Output: one human-readable line and, with --json, one line "JSON {...}" with img_per_s_median,
step_ms_median, framework "tensorflow", tf_version, ... like the PyTorch scripts.
Environment worth recording when you run it: TF_ENABLE_ONEDNN_OPTS (oneDNN is on by default in
x86 Linux builds since TF 2.9), ONEDNN_VERBOSE=1 to see which oneDNN kernels run.
"""
import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["resnet20", "tfcnn"], default="tfcnn")
    ap.add_argument("--batch", type=int, default=128, help="global batch (split evenly across towers)")
    ap.add_argument("--threads", type=int, default=1,
                    help="intra-op threads (one pool per process, shared by all towers)")
    ap.add_argument("--inter-op", type=int, default=None,
                    help="inter-op threads (default: --towers, i.e. 1 without towers)")
    ap.add_argument("--towers", type=int, default=1,
                    help="K>1: MirroredStrategy over K logical CPU devices (ReductionToOneDevice)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed warmup steps (the first one traces)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--xla", action="store_true",
                    help="tf.function(jit_compile=True) for the step (only with --towers 1)")
    ap.add_argument("--layers", action="store_true", help="print per-layer MAC table")
    ap.add_argument("--json", action="store_true", help="print one JSON result line at the end")
    ap.add_argument("--describe", action="store_true",
                    help="print what one training step computes as one line 'DESCRIBE {json}' and exit "
                         "(bench/peers/check_equivalence.py)")
    args = ap.parse_args()
    if args.towers < 1:
        ap.error("--towers must be >= 1")
    if args.batch % args.towers:
        ap.error(f"--batch {args.batch} is not divisible by --towers {args.towers}")
    if args.xla and args.towers > 1:
        ap.error("--xla is only supported with --towers 1 in this script")
    if args.inter_op is None:
        args.inter_op = args.towers
    return args


# ----------------------------------------------------------------------------
# Models: built with the Keras functional API; MACs are recorded from the static
# shapes while building (forward MACs of every Conv2D / Dense, as in the PyTorch script).
# ----------------------------------------------------------------------------
class Builder:
    def __init__(self, keras):
        self.keras = keras
        self.L = keras.layers
        self.rows = []  # (name, kind, description, macs)

    def conv(self, x, filters, k, strides=1, use_bias=True, activation=None, name=None):
        cin = int(x.shape[-1])
        y = self.L.Conv2D(filters, k, strides=strides, padding="same", use_bias=use_bias,
                          activation=activation, name=name)(x)
        ho, wo = int(y.shape[1]), int(y.shape[2])
        macs = ho * wo * filters * cin * k * k
        self.rows.append((name, "conv", f"{cin}->{filters} k{k}x{k} s{strides} out{ho}x{wo}", macs))
        return y

    def dense(self, x, units, activation=None, name=None):
        cin = int(x.shape[-1])
        y = self.L.Dense(units, activation=activation, name=name)(x)
        self.rows.append((name, "fc", f"{cin}->{units}", cin * units))
        return y

    def bn(self, x, name):
        return self.L.BatchNormalization(momentum=0.9, epsilon=1e-5, name=name)(x)

    def relu(self, x, name=None):
        return self.L.ReLU(name=name)(x)


def build_tfcnn(b):
    L = b.L
    inp = b.keras.Input(shape=(32, 32, 3), name="images")
    x = b.conv(inp, 64, 5, activation="relu", name="conv1")
    x = L.MaxPooling2D(pool_size=3, strides=2, padding="same", name="pool1")(x)
    x = b.conv(x, 64, 5, activation="relu", name="conv2")
    x = L.MaxPooling2D(pool_size=3, strides=2, padding="same", name="pool2")(x)
    x = L.Flatten(name="flatten")(x)
    x = b.dense(x, 384, activation="relu", name="fc1")
    x = b.dense(x, 192, activation="relu", name="fc2")
    out = b.dense(x, 10, name="fc3")
    return b.keras.Model(inp, out, name="tfcnn")


def build_resnet20(b, n=3):
    L = b.L
    inp = b.keras.Input(shape=(32, 32, 3), name="images")
    x = b.conv(inp, 16, 3, use_bias=False, name="conv1")
    x = b.relu(b.bn(x, "bn1"), "relu1")
    cin = 16
    for s, (cout, stride) in enumerate(((16, 1), (32, 2), (64, 2)), start=1):
        for i in range(n):
            st = stride if i == 0 else 1
            nm = f"s{s}b{i}"
            out = b.conv(x, cout, 3, strides=st, use_bias=False, name=nm + "_conv1")
            out = b.relu(b.bn(out, nm + "_bn1"), nm + "_relu1")
            out = b.conv(out, cout, 3, strides=1, use_bias=False, name=nm + "_conv2")
            out = b.bn(out, nm + "_bn2")
            if st != 1 or cin != cout:
                sc = b.conv(x, cout, 1, strides=st, use_bias=False, name=nm + "_sc_conv")
                sc = b.bn(sc, nm + "_sc_bn")
            else:
                sc = x
            x = b.relu(L.Add(name=nm + "_add")([out, sc]), nm + "_relu2")
            cin = cout
    x = L.GlobalAveragePooling2D(name="gap")(x)
    out = b.dense(x, 10, name="fc")
    return b.keras.Model(inp, out, name="resnet20")


BUILDERS = {"tfcnn": build_tfcnn, "resnet20": build_resnet20}


def graph_macs(graph, outputs):
    """Multiply-adds of the convolutions and matrix products that a traced step runs, forward and
    backward apart (the tape's ops are named gradient_tape/...), from the ops' own shapes. Only ops
    the outputs depend on count: TensorFlow prunes the rest of a function before it runs it (the
    first convolution's input gradient, say, which the tape traces but nothing reads)."""
    needed, stack = set(), [t.op for t in outputs]
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    def dims(t):
        return [int(d) for d in t.shape]

    def prod(v):
        out = 1
        for d in v:
            out *= d
        return out

    rows, fwd, bwd = [], 0, 0
    for op in graph.get_operations():
        if op.name not in needed:
            continue
        t = op.type
        if t == "Conv2D":
            kh, kw, ci, _ = dims(op.inputs[1])
            macs, kind = prod(dims(op.outputs[0])) * kh * kw * ci, "conv forward"
        elif t == "Conv2DBackpropInput":
            kh, kw, ci, _ = dims(op.inputs[1])
            macs, kind = prod(dims(op.inputs[2])) * kh * kw * ci, "conv backward input"
        elif t == "Conv2DBackpropFilter":
            kh, kw, ci, _ = dims(op.outputs[0])
            macs, kind = prod(dims(op.inputs[2])) * kh * kw * ci, "conv backward weight"
        elif t == "MatMul":
            a, b = dims(op.inputs[0]), dims(op.inputs[1])
            m = a[1] if op.get_attr("transpose_a") else a[0]
            k = a[0] if op.get_attr("transpose_a") else a[1]
            n = b[0] if op.get_attr("transpose_b") else b[1]
            macs, kind = m * n * k, "matmul"
        else:
            continue
        backward = op.name.startswith("gradient_tape")
        rows.append(dict(scope=op.name, op=kind, macs=macs))
        if backward:
            bwd += macs
        else:
            fwd += macs
    return rows, fwd, bwd


def describe(tf, model, tvars, builder_rows, args, nparams):
    """One image through the model in training mode, its loss and gradients, traced as the step
    traces them; multiply-adds counted from the traced graph's ops."""
    def grads(x, y):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        return tape.gradient(loss, tvars)

    concrete = tf.function(grads, autograph=False).get_concrete_function(
        tf.TensorSpec((1, 32, 32, 3), tf.float32), tf.TensorSpec((1,), tf.int64))
    rows, fwd, bwd = graph_macs(concrete.graph, concrete.outputs)

    def torch_layout(shape):  # Keras kernels HWIO -> OIHW, Dense [in, out] -> [out, in]
        shape = [int(d) for d in shape]
        if len(shape) == 4:
            return [shape[3], shape[2], shape[0], shape[1]]
        if len(shape) == 2:
            return [shape[1], shape[0]]
        return shape

    return dict(
        framework="tensorflow", tf_version=tf.version.VERSION, model=args.model, params=nparams,
        parameters=[dict(name=v.path if hasattr(v, "path") else v.name, shape=torch_layout(v.shape), trainable=True)
                    for v in tvars],
        buffers=[dict(name=v.path if hasattr(v, "path") else v.name, shape=[int(d) for d in v.shape])
                 for v in model.non_trainable_variables],
        fwd_macs_per_img=fwd, bwd_macs_per_img=bwd,
        fwd_macs_per_img_builder=sum(r[3] for r in builder_rows),
        layers=[dict(scope=name, op=kind, shape=desc, macs=macs) for name, kind, desc, macs in builder_rows],
        graph_products=rows,
        loss="tf.nn.sparse_softmax_cross_entropy_with_logits, mean over the global batch",
        optimizer=f"hand-written SGD: lr {args.lr}, momentum 0.9, coupled L2 weight decay 5e-4 on every "
                  "trainable variable (torch.optim.SGD semantics)")


def main():
    args = parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TF's INFO banner lines
    import numpy as np
    import tensorflow as tf

    # --- process-wide runtime configuration: must happen before any TF op runs -------------
    try:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
        cpus = tf.config.list_physical_devices("CPU")
        if args.towers > 1:
            tf.config.set_logical_device_configuration(
                cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(args.towers)])
    except RuntimeError as e:
        print(f"error: TensorFlow runtime was initialized before configuration: {e}", file=sys.stderr)
        return 2
    logical = tf.config.list_logical_devices("CPU")  # initializes the runtime
    dev_names = [d.name for d in logical]
    if len(dev_names) < args.towers:
        print(f"error: asked for {args.towers} towers but only logical CPUs {dev_names} exist",
              file=sys.stderr)
        return 2

    try:
        keras = tf.keras
        keras.layers  # tf.keras is a lazy loader in TF >= 2.16 (Keras 3); force the import here
    except Exception:
        import keras
    keras_version = getattr(keras, "__version__", None)
    if keras_version is None:
        try:
            import keras as _k
            keras_version = getattr(_k, "__version__", None)
        except Exception:
            pass
    try:
        keras.utils.set_random_seed(args.seed)
    except Exception:
        tf.random.set_seed(args.seed)

    if args.towers > 1:
        strategy = tf.distribute.MirroredStrategy(
            devices=dev_names[:args.towers],
            cross_device_ops=tf.distribute.ReductionToOneDevice())
        scope = strategy.scope()
        nrep = strategy.num_replicas_in_sync
    else:
        strategy = None
        scope = contextlib.nullcontext()
        nrep = 1

    B = args.batch
    per = B // nrep
    lr, momentum, wd = float(args.lr), 0.9, 5e-4

    with scope:
        b = Builder(keras)
        model = BUILDERS[args.model](b)
        tvars = list(model.trainable_variables)
        bufs = [tf.Variable(tf.zeros(tuple(int(d) for d in v.shape), dtype=tf.float32),
                            trainable=False, name=f"momentum_{i}")
                for i, v in enumerate(tvars)]
    fwd_macs = sum(r[3] for r in b.rows)
    fwd_flops = 2 * fwd_macs
    nparams = int(sum(int(np.prod([int(d) for d in v.shape])) for v in tvars))
    if args.describe:
        print("DESCRIBE " + json.dumps(describe(tf, model, tvars, b.rows, args, nparams)), flush=True)
        return 0

    rng = np.random.default_rng(args.seed)
    x_np = rng.standard_normal((B, 32, 32, 3), dtype=np.float32)
    y_np = rng.integers(0, 10, size=(B,), dtype=np.int64)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            loss = tf.reduce_sum(per_example) * (1.0 / B)  # share of the global-batch mean
        grads = tape.gradient(loss, tvars)
        if nrep > 1:
            grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
        for v, g, buf in zip(tvars, grads, bufs):
            g = g + wd * tf.convert_to_tensor(v)       # coupled L2 weight decay (torch SGD)
            buf.assign(momentum * buf + g)              # buf <- 0.9*buf + g
            v.assign_sub(lr * tf.convert_to_tensor(buf))  # w <- w - lr*buf
        return loss

    if nrep > 1:
        def _slice(arr, dtype):
            def value_fn(ctx):
                i = ctx.replica_id_in_sync_group
                with tf.device(dev_names[i]):
                    return tf.identity(tf.constant(arr[i * per:(i + 1) * per], dtype=dtype))
            return strategy.experimental_distribute_values_from_function(value_fn)

        x_in = _slice(x_np, tf.float32)
        y_in = _slice(y_np, tf.int64)

        @tf.function(autograph=False)  # no tensor-dependent Python control flow inside
        def train_step(x, y):
            per_replica_loss = strategy.run(replica_step, args=(x, y))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
    else:
        x_in = tf.constant(x_np)
        y_in = tf.constant(y_np)
        if args.xla:
            train_step = tf.function(replica_step, autograph=False, jit_compile=True)
        else:
            train_step = tf.function(replica_step, autograph=False)

    try:
        build_info = dict(tf.sysconfig.get_build_info())
    except Exception:
        build_info = {}
    onednn_enabled = None
    try:  # internal API; best effort only
        from tensorflow.python.util import _pywrap_util_port
        onednn_enabled = bool(_pywrap_util_port.IsMklEnabled())
    except Exception:
        pass

    print(f"# tensorflow {tf.version.VERSION} (git {tf.version.GIT_VERSION}) keras {keras_version} | "
          f"python {platform.python_version()} | intra_op={args.threads} inter_op={args.inter_op} "
          f"towers={nrep} devices={dev_names[:max(1, nrep)]} | model={args.model} batch={B} "
          f"(per tower {per}) params={nparams} NHWC", flush=True)
    print(f"# env TF_ENABLE_ONEDNN_OPTS={os.environ.get('TF_ENABLE_ONEDNN_OPTS')} "
          f"onednn(IsMklEnabled)={onednn_enabled} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
          f"xla={args.xla} cpu_compiler_flags={build_info.get('cpu_compiler_flags')}", flush=True)
    print(f"# forward MACs/img = {fwd_macs:,}  -> forward FLOPs/img = {fwd_flops:,} "
          f"({fwd_flops/1e6:.2f} MFLOP); train ~3x = {3*fwd_flops/1e6:.2f} MFLOP/img", flush=True)
    if args.layers:
        for name, kind, desc, macs in b.rows:
            print(f"#   {name:28s} {kind:4s} {desc:32s} {macs:>12,} MACs")

    losses = []
    t_warm0 = time.perf_counter()
    for _ in range(args.warmup):
        losses.append(float(train_step(x_in, y_in).numpy()))
    t_warm = time.perf_counter() - t_warm0

    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        lv = float(train_step(x_in, y_in).numpy())
        times.append(time.perf_counter() - t0)
        losses.append(lv)

    med = statistics.median(times)
    mean = statistics.fmean(times)
    ips_med = B / med
    ips_mean = B / mean
    train_gflops = ips_med * 3 * fwd_flops / 1e9
    res = dict(
        framework="tensorflow", tf_version=tf.version.VERSION, tf_git_version=tf.version.GIT_VERSION,
        keras_version=None if keras_version is None else str(keras_version),
        model=args.model, batch=B, batch_per_tower=per, towers=nrep, threads=args.threads,
        inter_op_threads=args.inter_op, devices=dev_names[:max(1, nrep)],
        cross_device_ops="ReductionToOneDevice" if nrep > 1 else None,
        data_format="NHWC", xla=args.xla,
        optimizer="SGD momentum 0.9, coupled L2 weight decay 5e-4 (torch.optim.SGD semantics), hand-written",
        warmup=args.warmup, steps=args.steps, warmup_total_s=round(t_warm, 4),
        step_ms_median=round(med * 1e3, 3), step_ms_mean=round(mean * 1e3, 3),
        step_ms_min=round(min(times) * 1e3, 3), step_ms_max=round(max(times) * 1e3, 3),
        step_ms_stdev=round(statistics.pstdev(times) * 1e3, 3),
        img_per_s_median=round(ips_med, 2), img_per_s_mean=round(ips_mean, 2),
        fwd_macs_per_img=fwd_macs, fwd_mflop_per_img=round(fwd_flops / 1e6, 3),
        train_gflop_per_s=round(train_gflops, 2), params=nparams,
        loss_first=round(losses[0], 4) if losses else None,
        loss_last=round(losses[-1], 4) if losses else None,
        tf_enable_onednn_opts=os.environ.get("TF_ENABLE_ONEDNN_OPTS"), onednn_enabled=onednn_enabled,
        python=platform.python_version(),
    )
    print(f"{args.model:9s} batch={B} threads={args.threads} towers={nrep}: "
          f"{ips_med:8.1f} img/s (median; mean {ips_mean:.1f})  "
          f"{med*1e3:8.2f} ms/step median [min {min(times)*1e3:.2f}, max {max(times)*1e3:.2f}, "
          f"sd {statistics.pstdev(times)*1e3:.2f}]  fwd {fwd_flops/1e6:.2f} MFLOP/img  "
          f"train ~{train_gflops:.2f} GFLOP/s  loss {res['loss_first']}->{res['loss_last']}", flush=True)
    if args.json:
        print("JSON " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
