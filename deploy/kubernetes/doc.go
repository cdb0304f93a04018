// Package kubernetes holds Scellis's Kubernetes manifests (a kustomization
// of YAML files, applied with kubectl apply -k) and the test that
// validates them: every document decodes strictly into the Kubernetes
// API types, and the federation init.sh makes fits them.
package kubernetes
