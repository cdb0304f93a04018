// Package compose holds compose.yaml, a whole federation on one machine
// from the release image, and the test that validates it: the compose
// specification's schema (compose-go, docker compose's own loader), and
// the federation its init service writes fits every other service.
package compose
