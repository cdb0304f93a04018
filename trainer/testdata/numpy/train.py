"""A plain-numpy softmax-regression trainer (the tests' fixture).

Mode and params come from the silo (scellis_trainer.main). params
"misbehave" makes it fail on purpose, one way per failure kind the silo
must turn into a clean decline.
"""
import os
import sys
import time

import numpy as np
import scellis_trainer as st

CLASSES, INPUTS = 3, 4


def build_model(params):
    rng = np.random.default_rng(int(params.get("init_seed", 0)))
    return {"w": rng.normal(0, 0.01, (INPUTS, CLASSES)), "b": np.zeros(CLASSES)}


def load_data(path, params):
    if params.get("misbehave") == "escape":
        probe(params)
    X, y = st.load_csv(path, "label")
    return st.ArrayLoader(X, y, batch_size=int(params.get("batch_size", 16)), seed=int(params.get("seed", 0)))


def softmax(z):
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def train(model, loader, params):
    bad = params.get("misbehave", "")
    if bad == "crash":
        raise RuntimeError("the trainer crashed on purpose")
    if bad == "hang":
        time.sleep(3600)
    if bad == "spin":
        while True:
            pass
    if bad == "memory":
        hog = [np.ones(1 << 27) for _ in range(1000)]
        print(len(hog))
    if bad == "garbage":
        os.makedirs(os.path.join(st.io_dir(), "out"), exist_ok=True)
        with open(os.path.join(st.io_dir(), "out", "weights.npy"), "wb") as f:
            f.write(b"this is not an npy file")
        with open(os.path.join(st.io_dir(), "out", "result.json"), "w") as f:
            f.write('{"examples": 3}')
        sys.exit(0)
    if bad == "nan":
        model["w"][0, 0] = np.nan
        return model
    if bad == "shape":
        model["w"] = np.zeros((INPUTS + 1, CLASSES))
        st.write_outputs(weights=st.flatten(model), examples=loader.examples)
        sys.exit(0)
    lr, epochs = float(params.get("lr", 0.1)), int(params.get("epochs", 1))
    for _ in range(epochs):
        for X, y in loader:
            p = softmax(X @ model["w"] + model["b"])
            p[np.arange(len(y)), y] -= 1
            model["w"] -= lr * X.T @ p / len(y)
            model["b"] -= lr * p.mean(0)
    return model


def probe(params):
    """Tries to reach outside the sandbox; writes what it managed into
    scratch-independent output (the result's metrics), 1 = reached."""
    import socket
    reached = {}
    try:
        s = socket.create_connection(("127.0.0.1", int(params["port"])), timeout=2)
        s.close()
        reached["socket"] = 1
    except OSError:
        reached["socket"] = 0
    for i, p in enumerate(params.get("forbidden", [])):
        try:
            with open(p, "rb") as f:
                f.read(1)
            reached["file%d" % i] = 1
        except OSError:
            reached["file%d" % i] = 0
    try:
        with open("/scratch/x", "w") as f:
            f.write("scratch is writable")
        reached["scratch"] = 1
    except OSError:
        reached["scratch"] = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                reached["capabilities"] = int(line.split()[1], 16)
            elif line.startswith("CapBnd:"):
                reached["bounding"] = int(line.split()[1], 16)
            elif line.startswith("NoNewPrivs:"):
                reached["no_new_privs"] = int(line.split()[1])
    st.write_outputs(examples=0, metrics=reached)
    sys.exit(0)


def evaluate(model, loader):
    n = correct = 0
    loss = 0.0
    for X, y in loader:
        p = softmax(X @ model["w"] + model["b"])
        loss += float(-np.log(p[np.arange(len(y)), y] + 1e-12).sum())
        correct += int((p.argmax(1) == y).sum())
        n += len(y)
    return {"examples": n, "correct": correct, "loss": loss}


if __name__ == "__main__":
    st.main(build_model, load_data, train, evaluate)
