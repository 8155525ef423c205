"""ONNX Runtime reference timings for `cargo xtask bench` (CPU rows).

Reads one JSON request per line on stdin and answers one JSON line per request on stdout, so
the bench starts one Python process per run and pays the import once. A request:

    {"op": "matmul", "m": 16, "n": 4096, "k": 4096, "bias": false, "activation": "none",
     "runs": 20, "warmup": 3, "flush_bytes": 0}
    {"op": "conv", "batch": 1, "channels": 144, "size": 56, "stride": 1, "layout": "nchw", ...}
    {"op": "conv2d", "batch": 1, "in_channels": 3, "out_channels": 32, "size": 224, "stride": 2,
     "layout": "nhwc", ...}
    {"op": "activation", "rows": 512, "cols": 3072, "bias": true, "activation": "gelu", ...}
    {"op": "mobilenet_v2", "size": 224, "stem": 32, "head": 1280, "classes": 1000,
     "blocks": [[32, 32, 16, 1], [16, 96, 24, 2], ...], ...}

The answer is {"ok": true, "samples": [seconds, ...]} or {"ok": false, "error": "..."}. Each
request builds a tiny ONNX graph of the op (MatMul; Gemm-free MatMul + Add + Gelu for the fused
epilogue; Conv with group = C, bias and Clip(0, 6); the dense conv, Conv with group = 1, bias and
Clip(0, 6); Add + Gelu/Relu/Clip; or the whole MobileNetV2 graph), opens a session with
2 intra-op threads (the bench machine's two cores) and times `run` on f32 inputs, warm, or
after writing `flush_bytes` of memory before every run when the bench flushes caches. The
matmul weight (and every conv weight) is a graph initializer, as in an exported model, so ONNX Runtime packs it once
at session creation (MatMul and Gemm pre-pack constant B); tilekit's `packed` rows do the same
with `pack_matmul_weights`, its other rows multiply the weight as stored at every call. With
"weight_input": true the weight is a graph input instead, fed at every run, so ONNX Runtime
multiplies it as stored too (packing it within the run): the like-for-like reference for
those rows.
Layout "nhwc" runs the NCHW graph between transposes of nothing: ONNX Runtime's CPU Conv is
NCHW only, so the timing is of its NCHW kernel on the same shape (said in the bench output).
"""

import json
import sys
import time


def main():
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except Exception as e:  # noqa: BLE001 - any import failure means "no ORT here"
        print(json.dumps({"ok": False, "error": f"onnxruntime unavailable: {e}"}), flush=True)
        return
    print(json.dumps({"ok": True, "version": ort.__version__}), flush=True)

    def session(nodes, inputs, outputs, inits):
        graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
        model.ir_version = 10
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 2
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])

    def tensor(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)

    def init(name, arr):
        return helper.make_tensor(name, TensorProto.FLOAT, arr.shape, arr.astype(np.float32).flatten().tolist())

    def act_nodes(act, src, dst):
        if act == "none":
            return [helper.make_node("Identity", [src], [dst])], []
        if act == "relu":
            return [helper.make_node("Relu", [src], [dst])], []
        if act == "relu6":
            lo = init("lo", np.array(0.0, dtype=np.float32))
            hi = init("hi", np.array(6.0, dtype=np.float32))
            return [helper.make_node("Clip", [src, "lo", "hi"], [dst])], [lo, hi]
        if act == "gelu":
            return [helper.make_node("Gelu", [src], [dst])], []
        if act == "gelu-tanh":
            return [helper.make_node("Gelu", [src], [dst], approximate="tanh")], []
        if act == "silu":
            # x * Sigmoid(x), the way PyTorch's ONNX export writes SiLU.
            return [helper.make_node("Sigmoid", [src], [dst + "_s"]),
                    helper.make_node("Mul", [src, dst + "_s"], [dst])], []
        raise ValueError(f"unknown activation {act}")

    rng = np.random.default_rng(0)
    flush_buf = None

    def mobilenet_v2(req):
        """MobileNetV2 as exported with its BatchNorms folded into the convs' biases (what
        tilekit's model runs): the stem conv (3x3, stride 2) + Clip, the blocks of `req["blocks"]`
        ([in, hidden, out, stride] each: 1x1 conv + Clip where hidden != in, depthwise 3x3 conv
        with group = hidden + Clip, 1x1 conv, + the input where stride 1 and in == out), the head
        1x1 conv + Clip, GlobalAveragePool, Flatten, Gemm. The weights are random (scaled by
        1/sqrt(fan-in)); the times do not depend on their values."""
        size, stem, head, classes = req["size"], req["stem"], req["head"], req["classes"]
        nodes = []
        inits = [init("lo", np.array(0.0)), init("hi", np.array(6.0))]

        def conv(src, dst, cout, cin_per_group, k, stride=1, group=1, relu6=True):
            name = f"c{len(nodes)}"
            w = rng.uniform(-1, 1, (cout, cin_per_group, k, k)) / np.sqrt(cin_per_group * k * k)
            inits.extend([init(name + "_w", w), init(name + "_b", rng.uniform(-0.1, 0.1, (cout,)))])
            out = dst + "_c" if relu6 else dst
            nodes.append(helper.make_node(
                "Conv", [src, name + "_w", name + "_b"], [out], group=group, kernel_shape=[k, k],
                pads=[k // 2] * 4, strides=[stride, stride]))
            if relu6:
                nodes.append(helper.make_node("Clip", [out, "lo", "hi"], [dst]))

        conv("x", "stem", stem, 3, 3, stride=2)
        cur = "stem"
        for i, (inp, hidden, oup, stride) in enumerate(req["blocks"]):
            src = cur
            if hidden != inp:
                conv(cur, f"b{i}_e", hidden, inp, 1)
                cur = f"b{i}_e"
            conv(cur, f"b{i}_d", hidden, 1, 3, stride=stride, group=hidden)
            conv(f"b{i}_d", f"b{i}_p", oup, hidden, 1, relu6=False)
            cur = f"b{i}_p"
            if stride == 1 and inp == oup:
                nodes.append(helper.make_node("Add", [src, cur], [f"b{i}_r"]))
                cur = f"b{i}_r"
        conv(cur, "head", head, req["blocks"][-1][2], 1)
        nodes.append(helper.make_node("GlobalAveragePool", ["head"], ["pool"]))
        nodes.append(helper.make_node("Flatten", ["pool"], ["flat"]))
        inits.extend([init("fc_w", rng.uniform(-1, 1, (classes, head)) / np.sqrt(head)),
                      init("fc_b", rng.uniform(-0.1, 0.1, (classes,)))])
        nodes.append(helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["y"], transB=1))
        sess = session(nodes, [tensor("x", [1, 3, size, size])], [tensor("y", [1, classes])], inits)
        return sess, rng.uniform(-1, 1, (1, 3, size, size)).astype(np.float32)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            op = req["op"]
            feeds = {}
            if op == "matmul":
                m, n, k = req["m"], req["n"], req["k"]
                # B stored [N, K] (nn.Linear / GGUF): Gemm with transB, as PyTorch exports Linear.
                w_shape = (n, k) if req.get("trans_b") else (k, n)
                w = rng.uniform(-1, 1, w_shape).astype(np.float32)
                if req.get("trans_b"):
                    nodes = [helper.make_node("Gemm", ["x", "w"], ["mm"], transB=1)]
                else:
                    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
                inputs = [tensor("x", [m, k])]
                if req.get("weight_input"):
                    inits = []
                    inputs.append(tensor("w", list(w_shape)))
                    feeds["w"] = w
                else:
                    inits = [init("w", w)]
                cur = "mm"
                if req["bias"]:
                    inits.append(init("b", rng.uniform(-1, 1, (n,))))
                    nodes.append(helper.make_node("Add", [cur, "b"], ["mb"]))
                    cur = "mb"
                an, ai = act_nodes(req["activation"], cur, "y")
                sess = session(nodes + an, inputs, [tensor("y", [m, n])], inits + ai)
                feeds["x"] = rng.uniform(-1, 1, (m, k)).astype(np.float32)
            elif op == "conv":
                b, c, s, st = req["batch"], req["channels"], req["size"], req["stride"]
                o = (s + 2 - 3) // st + 1
                inits = [init("w", rng.uniform(-1, 1, (c, 1, 3, 3))), init("b", rng.uniform(-1, 1, (c,)))]
                conv = helper.make_node(
                    "Conv", ["x", "w", "b"], ["cv"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[st, st]
                )
                an, ai = act_nodes("relu6", "cv", "y")
                sess = session([conv] + an, [tensor("x", [b, c, s, s])], [tensor("y", [b, c, o, o])], inits + ai)
                feeds["x"] = rng.uniform(-1, 1, (b, c, s, s)).astype(np.float32)
            elif op == "conv2d":
                # The dense 3x3 conv (one group; MobileNetV2's stem), weight [Cout, Cin, 3, 3].
                b, ci, co, s, st = req["batch"], req["in_channels"], req["out_channels"], req["size"], req["stride"]
                o = (s + 2 - 3) // st + 1
                inits = [init("w", rng.uniform(-1, 1, (co, ci, 3, 3))), init("b", rng.uniform(-1, 1, (co,)))]
                conv = helper.make_node(
                    "Conv", ["x", "w", "b"], ["cv"], group=1, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[st, st]
                )
                an, ai = act_nodes("relu6", "cv", "y")
                sess = session([conv] + an, [tensor("x", [b, ci, s, s])], [tensor("y", [b, co, o, o])], inits + ai)
                feeds["x"] = rng.uniform(-1, 1, (b, ci, s, s)).astype(np.float32)
            elif op == "activation":
                r, c = req["rows"], req["cols"]
                nodes, inits, cur = [], [], "x"
                if req["bias"]:
                    inits.append(init("b", rng.uniform(-1, 1, (c,))))
                    nodes.append(helper.make_node("Add", ["x", "b"], ["xb"]))
                    cur = "xb"
                an, ai = act_nodes(req["activation"], cur, "y")
                sess = session(nodes + an, [tensor("x", [r, c])], [tensor("y", [r, c])], inits + ai)
                feeds["x"] = rng.uniform(-4, 4, (r, c)).astype(np.float32)
            elif op == "mobilenet_v2":
                sess, feeds["x"] = mobilenet_v2(req)
            else:
                raise ValueError(f"unknown op {op}")
            flush = int(req.get("flush_bytes", 0))
            if flush and (flush_buf is None or flush_buf.nbytes != flush):
                flush_buf = np.zeros(flush // 8, dtype=np.float64)
            for _ in range(int(req.get("warmup", 3))):
                sess.run(None, feeds)
            samples = []
            for _ in range(int(req.get("runs", 20))):
                if flush:
                    flush_buf += 1.0
                t = time.perf_counter()
                sess.run(None, feeds)
                samples.append(time.perf_counter() - t)
            # The session goes before the answer does: its intra-op threads spin for a while
            # after a run, and the bench times tilekit's next row as soon as it has the answer.
            del sess
            print(json.dumps({"ok": True, "samples": samples}), flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the bench as a failed reference
            print(json.dumps({"ok": False, "error": str(e)}), flush=True)


if __name__ == "__main__":
    main()
