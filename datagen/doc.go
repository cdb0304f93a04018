// Package datagen generates federated datasets with a known ground truth:
// non-IID patient records for a handful of hospitals (Hospitals), and the
// Synthetic(α, β) benchmark of FedProx (Synthetic). Each site's rows come
// with the model that labelled them, so tests and demos can compare what a
// federation learns with the truth.
//
// Invariant: generation is a pure function of its arguments and seed — the
// same call gives byte-identical CSV files on every run — and every label is
// drawn from the site's documented Truth model applied to the values exactly
// as written (after rounding).
package datagen
