// Package model holds the local models and trainers of Scellis: logistic
// regression (binary), softmax regression (multi-class), linear regression
// and a small one-hidden-layer MLP, trained by mini-batch SGD or AdamW, with
// the proximal (FedProx) and control-variate (SCAFFOLD) terms federated
// strategies need, and DP-SGD with Poisson sampling and per-example clipping.
// It also loads CSV datasets, splits them, standardises them and scores
// models.
//
// Invariant: without DP, everything here is a pure function of its inputs and
// seeds — the same model, data and TrainConfig give byte-identical Params on
// every run (on one architecture; see Train). Randomness for DP (Poisson
// sampling and noise) comes only from cryptographically secure generators.
//
// # Parameter layout
//
// Every model is an optional tanh hidden layer, an affine output layer and a
// loss head. Params is one flat []float64 in this canonical order, every
// weight matrix row-major with one row per output unit:
//
//	kind      Params                                        length
//	logistic  w[0..d-1], b                                  d+1
//	linear    w[0..d-1], b                                  d+1
//	softmax   W[K×d] (row k = class k), b[0..K-1]           K·d+K
//	mlp       W1[H×d], b1[H], W2[O×H], b2[O]                H·d+H+O·H+O
//
// where d = Spec.Inputs, K = Spec.Classes, H = Spec.Hidden, and for mlp
// O = 1 when Classes is 1 (regression, squared loss) or 2 (binary, sigmoid
// and log-loss) and O = Classes when Classes ≥ 3 (softmax and log-loss).
// So W[k][j] of softmax is Params[k*d+j], and the logistic weight of feature j
// is Params[j] with the intercept last.
//
// Losses per example: log-loss (cross-entropy in nats) for the classification
// heads and ½(ŷ−y)² for regression. Labels are 0/1 for binary models and
// 0..K−1 for multi-class models.
package model
