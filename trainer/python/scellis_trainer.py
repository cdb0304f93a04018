"""scellis_trainer: run your own training loop inside a Scellis silo.

The silo runs a trainer as `INTERPRETER ENTRY MODE` in a sandbox, with the
environment variable SCELLIS_IO naming the exchange directory:

    IO/in/params.json   {"format": "scellis/trainer/v1", "mode": MODE,
                         "data": path of the dataset file (read-only) or null,
                         "label": the label column,
                         "layout": [{"name": ..., "shape": [...]}, ...],
                         "params": {"lr", "epochs", "mu", "batch_size",
                                    "seed", "round", "work", ...}}
    IO/in/weights.npy   the global model, one flat float64 array, the
                         tensors of "layout" one after the other (C order)
    IO/out/weights.npy  (train, init) the trained weights, same length
    IO/out/result.json  {"examples": N, "metrics": {name: number}}
    IO/out/layout.json  (init) the layout of out/weights.npy
    IO/out/predictions.npy (predict) one row per data row, in the file's
                         order: the model's outputs (class probabilities)
    IO/out/model.onnx   (export) the model with the weights of
                         in/weights.npy, as ONNX, when the trainer gives
                         main example_input or export

Only numpy is needed to read and write these files. This module turns
them into two calls you write:

    train(model, loader, params) -> model
    evaluate(model, loader) -> {"examples": n, "correct": c, "loss": sum}

for a torch.nn.Module or for plain numpy (a dict of name -> ndarray), and
main(build_model, load_data, train, evaluate) dispatches on MODE. The
silo, not the trainer, clips, noises, charges and masks what train
returns: whatever the trainer does, only the clipped, noised update leaves.
"""

import json
import os
import sys
import time

import numpy as np

FORMAT = "scellis/trainer/v1"

# In predict mode the loaders keep the data file's order (predictions are
# matched to rows by position); set by main.
_IN_ORDER = False


def io_dir():
    return os.environ.get("SCELLIS_IO", "io")


def read_inputs(io=None):
    """Returns (spec, weights): params.json as a dict, and the flat
    global weights (None when the mode has none, as in init)."""
    io = io or io_dir()
    with open(os.path.join(io, "in", "params.json")) as f:
        spec = json.load(f)
    if spec.get("format") != FORMAT:
        raise SystemExit("scellis_trainer: params.json has format %r, not %r" % (spec.get("format"), FORMAT))
    w = None
    path = os.path.join(io, "in", "weights.npy")
    if os.path.exists(path):
        w = np.load(path, allow_pickle=False).astype(np.float64).ravel()
    return spec, w


def write_outputs(weights=None, examples=0, metrics=None, layout=None, io=None):
    """Writes the trainer's answer: out/weights.npy, out/result.json and,
    for init, out/layout.json."""
    io = io or io_dir()
    out = os.path.join(io, "out")
    os.makedirs(out, exist_ok=True)
    if weights is not None:
        np.save(os.path.join(out, "weights.npy"), np.asarray(weights, dtype=np.float64).ravel(), allow_pickle=False)
    if layout is not None:
        with open(os.path.join(out, "layout.json"), "w") as f:
            json.dump(layout, f)
    res = {"examples": int(examples), "metrics": {k: float(v) for k, v in (metrics or {}).items()}}
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(res, f)


# --- models: torch modules or dicts of numpy arrays -------------------------

def _is_torch(model):
    # A torch module exists only once torch is loaded: a numpy trainer
    # never pays torch's import (seconds on a busy machine) to learn so.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def layout_of(model):
    """The model's tensors as [{"name", "shape"}], in the order they are
    flattened: state_dict order for torch, insertion order for a dict."""
    if _is_torch(model):
        return [{"name": k, "shape": list(v.shape)} for k, v in model.state_dict().items()]
    return [{"name": k, "shape": list(np.shape(v))} for k, v in model.items()]


def flatten(model):
    """The model's tensors as one flat float64 array (layout_of's order)."""
    if _is_torch(model):
        parts = [v.detach().cpu().double().numpy().ravel() for v in model.state_dict().values()]
    else:
        parts = [np.asarray(v, dtype=np.float64).ravel() for v in model.values()]
    return np.concatenate(parts) if parts else np.zeros(0)


def load_flat(model, flat, layout):
    """Loads a flat array into the model, checking it against layout."""
    ours = layout_of(model)
    if [(l["name"], list(l["shape"])) for l in ours] != [(l["name"], list(l["shape"])) for l in layout]:
        raise SystemExit("scellis_trainer: the model built here does not have the run's layout")
    total = sum(int(np.prod(l["shape"])) for l in layout)
    if flat.size != total:
        raise SystemExit("scellis_trainer: %d weights for a layout of %d" % (flat.size, total))
    if _is_torch(model):
        import torch
        sd = model.state_dict()
        i = 0
        for l in layout:
            n = int(np.prod(l["shape"]))
            t = sd[l["name"]]
            sd[l["name"]] = torch.from_numpy(flat[i:i + n].reshape(l["shape"])).to(t.dtype)
            i += n
        model.load_state_dict(sd)
        return model
    i = 0
    for l in layout:
        n = int(np.prod(l["shape"]))
        model[l["name"]] = flat[i:i + n].reshape(l["shape"]).copy()
        i += n
    return model


# --- data ---------------------------------------------------------------------

def load_csv(path, label="label"):
    """A CSV with a header row: (X float32 [n, d], y int64 [n]), the label
    column taken out, the other columns in file order."""
    with open(path) as f:
        header = f.readline().strip().split(",")
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    j = header.index(label)
    y = data[:, j].astype(np.int64)
    X = np.delete(data, j, axis=1).astype(np.float32)
    return X, y


class ArrayLoader:
    """Minibatches of (X, y) numpy arrays, reshuffled each pass by a
    seeded generator; torch=True yields tensors."""

    def __init__(self, X, y, batch_size=32, shuffle=True, seed=0, shape=None, torch=False):
        self.X, self.y = X, y
        self.batch_size, self.shuffle, self.shape, self.torch = int(batch_size), shuffle, shape, torch
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return (len(self.y) + self.batch_size - 1) // self.batch_size

    @property
    def examples(self):
        return len(self.y)

    def __iter__(self):
        shuffle = self.shuffle and not _IN_ORDER
        idx = self.rng.permutation(len(self.y)) if shuffle else np.arange(len(self.y))
        for s in range(0, len(idx), self.batch_size):
            b = idx[s:s + self.batch_size]
            X, y = self.X[b], self.y[b]
            if self.shape is not None:
                X = X.reshape((len(b),) + tuple(self.shape))
            if self.torch:
                import torch
                yield torch.from_numpy(np.ascontiguousarray(X)), torch.from_numpy(y)
            else:
                yield X, y


# --- ready-made loops for torch ----------------------------------------------

def torch_train(model, loader, params):
    """Minibatch SGD (momentum params["momentum"], default 0) with
    cross-entropy for params["epochs"] passes at params["lr"], plus
    FedProx's mu/2·||θ − w||² from the incoming global weights when
    params["mu"] > 0; a straggler (params["work"] < 1) does that fraction
    of the steps. Returns the model."""
    import torch
    lr, epochs, mu = float(params.get("lr", 0.05)), int(params.get("epochs", 1)), float(params.get("mu", 0.0))
    work = float(params.get("work", 1.0))
    anchor = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=float(params.get("momentum", 0.0)))
    lossf = torch.nn.CrossEntropyLoss()
    steps = max(1, int(round(epochs * len(loader) * work)))
    done = 0
    model.train()
    while done < steps:
        for X, y in loader:
            opt.zero_grad()
            loss = lossf(model(X), y)
            if mu > 0:
                loss = loss + mu / 2 * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
            loss.backward()
            opt.step()
            done += 1
            if done >= steps:
                break
    return model


def torch_evaluate(model, loader):
    """Sums over the loader's rows: examples, correct, loss (cross-entropy)."""
    import torch
    model.eval()
    n, correct, loss = 0, 0, 0.0
    with torch.no_grad():
        for X, y in loader:
            out = model(X)
            loss += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
            n += len(y)
    return {"examples": n, "correct": correct, "loss": loss}


def torch_predict(model, loader):
    """The softmax of the model's outputs, one row per example, in the
    loader's order."""
    import torch
    model.eval()
    out = []
    with torch.no_grad():
        for X, _ in loader:
            out.append(torch.softmax(model(X), dim=1).double().numpy())
    return np.concatenate(out) if out else np.zeros((0, 0))


def torch_export_onnx(model, example, path):
    """Writes a torch module as ONNX (torch.onnx.export; no onnx package
    needed), its first input's and output's first axis a batch of any
    size."""
    import torch
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, example, path, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


# --- the entry point ----------------------------------------------------------

def main(build_model, load_data, train=None, evaluate=None, argv=None, example_input=None, export=None, predict=None):
    """Runs the mode the silo or scellis asks for (argv[1]: init, train,
    evaluate, predict or export).

    build_model(params) -> a torch.nn.Module or a dict of numpy arrays
    load_data(path, params) -> a loader train and evaluate accept; it should
        have an `examples` attribute (else len(loader.dataset) is tried)
    train(model, loader, params) -> model   (default torch_train)
    evaluate(model, loader) -> dict of sums (default torch_evaluate)
    example_input(params) -> one input of the torch model (a batch of one):
        export writes the model as ONNX with torch_export_onnx
    export(model, path, params) writes the model as ONNX at path itself
    Without either, export writes no model.onnx (scellis says SC9512).
    predict(model, loader) -> an array, one row per example in the data
        file's order (default torch_predict: class probabilities). In
        predict mode params["predict"] is true and ArrayLoader keeps the
        file's order; a loader of the trainer's own must too.
    """
    argv = sys.argv if argv is None else argv
    mode = argv[1] if len(argv) > 1 else "train"
    spec, w = read_inputs()
    params = dict(spec.get("params") or {})
    seed = int(params.get("seed", 0)) % (2 ** 31)
    np.random.seed(seed)
    # torch is seeded when the trainer uses it: it imported torch (at the
    # top of its file, before main runs) or leaves a loop to torch's
    # defaults. A numpy trainer that brings both loops does not load it.
    torch = sys.modules.get("torch")
    if torch is None and (train is None or evaluate is None):
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None:
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    model = build_model(params)
    if mode == "init":
        write_outputs(weights=flatten(model), layout=layout_of(model))
        return
    load_flat(model, w, spec["layout"])
    if mode == "export":
        path = os.path.join(io_dir(), "out", "model.onnx")
        if export is not None:
            export(model, path, params)
        elif example_input is not None and _is_torch(model):
            torch_export_onnx(model, example_input(params), path)
        write_outputs()
        return
    global _IN_ORDER
    if mode == "predict":
        _IN_ORDER = True
        params["predict"] = True
    loader = load_data(spec["data"], params)
    examples = getattr(loader, "examples", None)
    if examples is None:
        examples = len(loader.dataset)
    if mode == "evaluate":
        m = (evaluate or torch_evaluate)(model, loader)
        write_outputs(examples=examples, metrics=m)
        return
    if mode == "predict":
        p = np.asarray((predict or torch_predict)(model, loader), dtype=np.float64)
        if p.ndim == 1:
            p = p.reshape(-1, 1)
        np.save(os.path.join(io_dir(), "out", "predictions.npy"), p, allow_pickle=False)
        write_outputs(examples=examples)
        return
    if mode != "train":
        raise SystemExit("scellis_trainer: unknown mode %r (init, train, evaluate, predict or export)" % mode)
    began = time.perf_counter()
    model = (train or torch_train)(model, loader, params)
    # The seconds train() took: what a round spends beyond them is the
    # protocol's overhead (the silo logs it; nothing of it is released).
    write_outputs(weights=flatten(model), examples=examples, metrics={"train_seconds": time.perf_counter() - began})
