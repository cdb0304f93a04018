"""A PyTorch CNN trainer for the glyphs images (scellis datagen glyphs).

The silo runs `python3 train.py MODE` in its sandbox; scellis_trainer
(the helper the silo puts on the import path) reads the global weights and
round parameters, calls build_model, load_data and train here, and writes
the trained weights back. See docs/trainers.md.
"""
import torch
from torch import nn

import scellis_trainer as st

SIDE = 16


class GlyphNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)   # 16×16 → pool → 8×8
        self.conv2 = nn.Conv2d(6, 12, 3, padding=1)  # 8×8 → pool → 4×4
        self.fc = nn.Linear(12 * 4 * 4, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def build_model(params):
    torch.manual_seed(int(params.get("init_seed", 0)))
    return GlyphNet()


def load_data(path, params):
    X, y = st.load_csv(path, "label")
    return st.ArrayLoader(X, y, batch_size=int(params.get("batch_size", 32)),
                          seed=int(params.get("seed", 0)), shape=(1, SIDE, SIDE), torch=True)


def train(model, loader, params):
    # Your own loop goes here; this one is the helper's: SGD on
    # cross-entropy for params["epochs"] at params["lr"], plus FedProx's
    # proximal term when params["mu"] > 0.
    return st.torch_train(model, loader, params)


def evaluate(model, loader):
    return st.torch_evaluate(model, loader)


def example_input(params):
    # One image: scellis trainer export writes the model as ONNX from it.
    return torch.zeros(1, 1, SIDE, SIDE)


if __name__ == "__main__":
    st.main(build_model, load_data, train, evaluate, example_input=example_input)
