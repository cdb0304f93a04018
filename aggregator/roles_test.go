package aggregator

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scellis/scellis/api"
	"github.com/scellis/scellis/content"
	"github.com/scellis/scellis/identity"
	"github.com/scellis/scellis/trust"
)

// Every endpoint, called by a member of every role through real mutual
// TLS: a role the endpoint does not allow gets 403 with SC7108 naming the
// roles that may; an allowed role gets past the role check (whatever the
// handler then says about the empty request).
func TestEveryEndpointChecksRoles(t *testing.T) {
	members := []testMember{{"s1", identity.Silo}, {"w1", identity.Worker}, {"alice", identity.Researcher}, {"ops", identity.Operator}}
	p := startTestNode(t, trust.Own, members, Options{})
	self, _ := p.fed.Member("agg-1")
	blobBody := []byte("x")
	ref := string(content.Hash(blobBody))
	for _, name := range []string{"agg-1", "s1", "w1", "alice", "ops"} {
		m, _ := p.fed.Member(name)
		cfg, err := identity.ClientTLSConfig(p.ids[name], p.fed, "", identity.Aggregator)
		if err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Transport: api.Transport(cfg), Timeout: 20 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		for _, e := range api.Endpoints() {
			path := strings.NewReplacer("{id}", ref, "{ref}", ref).Replace(e.Path)
			body := []byte(`{}`)
			switch {
			case e.Method == "PUT":
				body = blobBody
			case strings.HasPrefix(e.Path, "/v1/cluster/"):
				body = []byte(`{"member":"nobody"}`)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			req, _ := http.NewRequestWithContext(ctx, e.Method, "https://"+self.Address+path, bytes.NewReader(body))
			resp, err := hc.Do(req)
			if err != nil {
				cancel()
				t.Fatalf("%s as %s: %v", e, name, err)
			}
			out, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			cancel()
			if e.Allows(m.Role) {
				if resp.StatusCode == http.StatusForbidden {
					t.Errorf("%s as %s (%s): 403, but the role is allowed: %s", e, name, m.Role, out)
				}
				continue
			}
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(out), "SC7108") || !strings.Contains(string(out), string(e.Roles[0])) {
				t.Errorf("%s as %s (%s): %d %s; want 403 with SC7108 naming the allowed roles", e, name, m.Role, resp.StatusCode, out)
			}
		}
	}
}
