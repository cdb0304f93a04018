package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/scellis/scellis/deploy/internal/testbin"
)

// kustomization is the part of kustomize's Kustomization these manifests
// use; decoded strictly, so any other field fails the test.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name, NewName, NewTag string
	} `json:"images"`
	GeneratorOptions struct {
		DisableNameSuffixHash bool `json:"disableNameSuffixHash"`
	} `json:"generatorOptions"`
	SecretGenerator []struct {
		Name  string   `json:"name"`
		Files []string `json:"files"`
	} `json:"secretGenerator"`
}

// manifests is what the folder declares, decoded into the Kubernetes API
// types.
type manifests struct {
	k            kustomization
	namespaces   []*corev1.Namespace
	services     []*corev1.Service
	claims       []*corev1.PersistentVolumeClaim
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	secrets      map[string]map[string]string // generated secret → key → file under the folder
}

// load decodes kustomization.yaml and every resource it lists, each YAML
// document strictly into the API type of its kind (k8s.io/api, the types
// the API server's schema is generated from): an unknown or misspelt
// field, a wrong type or an unknown kind fails.
func load(t *testing.T, dir string) *manifests {
	t.Helper()
	m := &manifests{secrets: map[string]map[string]string{}}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &m.k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if m.k.APIVersion != "kustomize.config.k8s.io/v1beta1" || m.k.Kind != "Kustomization" || !m.k.GeneratorOptions.DisableNameSuffixHash {
		t.Fatalf("kustomization.yaml: %+v", m.k)
	}
	for _, g := range m.k.SecretGenerator {
		m.secrets[g.Name] = map[string]string{}
		for _, f := range g.Files {
			key, path, ok := strings.Cut(f, "=")
			if !ok {
				key, path = filepath.Base(f), f
			}
			m.secrets[g.Name][key] = path
		}
	}
	for _, r := range m.k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			if err := m.decode([]byte(doc)); err != nil {
				t.Fatalf("%s, document %d: %v", r, i+1, err)
			}
		}
	}
	return m
}

func stripComments(doc string) string {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")
}

// decodeInto decodes doc strictly into a new T appended to list.
func decodeInto[T any](list *[]*T, doc []byte) error {
	o := new(T)
	*list = append(*list, o)
	return yaml.UnmarshalStrict(doc, o)
}

func (m *manifests) decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Namespace":
		return decodeInto(&m.namespaces, doc)
	case "v1 Service":
		return decodeInto(&m.services, doc)
	case "v1 PersistentVolumeClaim":
		return decodeInto(&m.claims, doc)
	case "apps/v1 StatefulSet":
		return decodeInto(&m.statefulSets, doc)
	case "apps/v1 Deployment":
		return decodeInto(&m.deployments, doc)
	}
	return fmt.Errorf("kind %q of %q: not one these manifests are checked for", tm.Kind, tm.APIVersion)
}

// The manifests decode strictly into the Kubernetes API types, and hold
// what a federation needs: three aggregators with stable names and a
// volume each, a headless Service for their DNS names, a silo with its
// data read-only and one writer, non-root pods, and every key from a
// generated Secret.
func TestManifests(t *testing.T) {
	m := load(t, ".")
	if len(m.namespaces) != 1 || m.namespaces[0].Name != m.k.Namespace {
		t.Fatalf("want one Namespace, %q, as kustomization.yaml says", m.k.Namespace)
	}
	if len(m.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets, want the aggregators'", len(m.statefulSets))
	}
	sts := m.statefulSets[0]
	checkAggregators(t, m, sts)
	if len(m.deployments) == 0 {
		t.Fatal("no silo Deployment")
	}
	for _, d := range m.deployments {
		checkSilo(t, m, d)
	}
	for _, spec := range append([]corev1.PodSpec{sts.Spec.Template.Spec}, podSpecs(m.deployments)...) {
		checkPod(t, m, spec)
	}
}

func podSpecs(ds []*appsv1.Deployment) []corev1.PodSpec {
	var s []corev1.PodSpec
	for _, d := range ds {
		s = append(s, d.Spec.Template.Spec)
	}
	return s
}

// checkAggregators: three replicas started together (a lone first pod is
// never ready), a headless Service published before readiness whose
// selector picks the pods, a claim template for the Raft state, and the
// config chosen by pod name.
func checkAggregators(t *testing.T, m *manifests, sts *appsv1.StatefulSet) {
	t.Helper()
	s := sts.Spec
	if replicas(s.Replicas) != 3 || s.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("aggregators: replicas %d, pod management %q; want 3, Parallel", replicas(s.Replicas), s.PodManagementPolicy)
	}
	sel, err := metav1.LabelSelectorAsSelector(s.Selector)
	if err != nil || !sel.Matches(labels.Set(s.Template.Labels)) {
		t.Errorf("the StatefulSet's selector %v does not pick its pods %v", s.Selector, s.Template.Labels)
	}
	svc := find(m.services, s.ServiceName)
	if svc == nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses ||
		!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(s.Template.Labels)) {
		t.Errorf("serviceName %q: want a headless Service publishing not-ready pods and selecting them, got %+v", s.ServiceName, svc)
	}
	if len(s.VolumeClaimTemplates) != 1 || !mountedAt(s.Template.Spec.Containers[0], s.VolumeClaimTemplates[0].Name, "/var/lib/scellis", false) {
		t.Errorf("aggregators: want one claim template mounted read-write at /var/lib/scellis, got %d", len(s.VolumeClaimTemplates))
	}
	c := s.Template.Spec.Containers[0]
	if strings.Join(c.Args, " ") != "aggregator --config /etc/scellis/$(POD_NAME)/aggregator.yaml" ||
		len(c.Env) != 1 || c.Env[0].Name != "POD_NAME" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("aggregator container: args %q, env %+v", c.Args, c.Env)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("aggregator probes: readiness %+v liveness %+v", c.ReadinessProbe, c.LivenessProbe)
	}
}

// checkSilo: one replica replaced by stopping it first (the ledger's one
// writer), the data claim mounted read-only both in the volume and the
// mount.
func checkSilo(t *testing.T, m *manifests, d *appsv1.Deployment) {
	t.Helper()
	s := d.Spec
	if replicas(s.Replicas) != 1 || s.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("%s: replicas %d, strategy %q; want 1, Recreate", d.Name, replicas(s.Replicas), s.Strategy.Type)
	}
	sel, err := metav1.LabelSelectorAsSelector(s.Selector)
	if err != nil || !sel.Matches(labels.Set(s.Template.Labels)) {
		t.Errorf("%s: the selector does not pick its pods", d.Name)
	}
	c := s.Template.Spec.Containers[0]
	if len(c.Args) != 3 || c.Args[0] != "silo" {
		t.Fatalf("%s: args %q", d.Name, c.Args)
	}
	member := filepath.Base(filepath.Dir(c.Args[2]))
	var data *corev1.Volume
	for i, v := range s.Template.Spec.Volumes {
		if mountedAt(c, v.Name, "/srv/scellis/"+member, true) {
			data = &s.Template.Spec.Volumes[i]
		}
	}
	if data == nil || data.PersistentVolumeClaim == nil || !data.PersistentVolumeClaim.ReadOnly || find(m.claims, data.PersistentVolumeClaim.ClaimName) == nil {
		t.Errorf("%s: want a declared claim mounted read-only at /srv/scellis/%s, got %+v", d.Name, member, data)
	}
}

// checkPod: the restricted pod security standard's demands, the image's
// user, and every secret a volume takes is generated, with the keys it
// names.
func checkPod(t *testing.T, m *manifests, p corev1.PodSpec) {
	t.Helper()
	ps := p.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser != 65532 ||
		ps.FSGroup == nil || *ps.FSGroup != 65532 || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v", ps)
	}
	for _, c := range p.Containers {
		cs := c.SecurityContext
		if c.Image != m.k.Images[0].Name || cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation ||
			cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem || cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container %s: image %q, security context %+v", c.Name, c.Image, cs)
		}
		if !mountedAt(c, "tmp", "/tmp", false) {
			t.Errorf("container %s: no writable /tmp beside its read-only root", c.Name)
		}
	}
	for _, v := range p.Volumes {
		var refs []*corev1.SecretProjection
		if v.Secret != nil {
			refs = append(refs, &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: v.Secret.SecretName}, Items: v.Secret.Items})
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				refs = append(refs, src.Secret)
			}
		}
		for _, r := range refs {
			keys, ok := m.secrets[r.Name]
			if !ok {
				t.Errorf("volume %s takes secret %q, which kustomization.yaml does not generate", v.Name, r.Name)
			}
			for _, it := range r.Items {
				if _, ok := keys[it.Key]; !ok {
					t.Errorf("volume %s takes key %q of %s, which is not generated", v.Name, it.Key, r.Name)
				}
			}
		}
	}
}

// replicas is a spec's replica count, 1 when unset (the API's default).
func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

func mountedAt(c corev1.Container, volume, path string, readOnly bool) bool {
	for _, vm := range c.VolumeMounts {
		if vm.Name == volume && vm.MountPath == path && vm.ReadOnly == readOnly {
			return true
		}
	}
	return false
}

func find[T interface{ GetName() string }](objs []T, name string) T {
	for _, o := range objs {
		if o.GetName() == name {
			return o
		}
	}
	var zero T
	return zero
}

// init.sh, run as the walkthrough runs it (the real scellis federation
// init), makes every file the secret generator reads; each aggregator pod
// finds, under its own name, the folder of the member whose federation
// address is its DNS name; the configs pass scellis config check (state
// and data moved under the test's folder) and listen where the probes and
// ports point.
func TestInitScriptFitsManifests(t *testing.T) {
	bin, err := testbin.Scellis()
	if err != nil {
		t.Fatal(err)
	}
	m := load(t, ".")
	dir := t.TempDir()
	script, _ := os.ReadFile("init.sh")
	os.WriteFile(filepath.Join(dir, "init.sh"), script, 0o755)
	cmd := exec.Command("sh", filepath.Join(dir, "init.sh"))
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"), "NAMESPACE="+m.k.Namespace)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("init.sh: %v\n%s", err, out)
	}
	for name, keys := range m.secrets {
		for key, path := range keys {
			if _, err := os.Stat(filepath.Join(dir, path)); err != nil {
				t.Errorf("secret %s, key %s: init.sh made no %s", name, key, path)
			}
		}
	}
	// Pod i's folder is the member whose address is pod i's DNS name.
	sts := m.statefulSets[0]
	fed, _ := os.ReadFile(filepath.Join(dir, "fed", "federation.yaml"))
	for _, it := range sts.Spec.Template.Spec.Volumes[0].Projected.Sources[0].Secret.Items {
		pod, file := filepath.Dir(it.Path), filepath.Base(it.Path)
		member := strings.TrimSuffix(it.Key, "."+file)
		host := fmt.Sprintf("%s.%s.%s.svc.cluster.local:7400", pod, sts.Spec.ServiceName, m.k.Namespace)
		if !regexp.MustCompile(`(?m)^  - name: ` + regexp.QuoteMeta(member) + `\n(    .*\n)*    address: ` + regexp.QuoteMeta(host) + `\n`).Match(fed) {
			t.Errorf("%s mounts %s's %s, but the federation file does not give %s the address %s", pod, member, file, member, host)
		}
	}
	moved := strings.NewReplacer("/var/lib/scellis", filepath.Join(dir, "state"), "/srv/scellis", filepath.Join(dir, "srv"))
	if err := testbin.PatientsCSV(bin, filepath.Join(dir, "srv", "silo-1")); err != nil {
		t.Fatal(err)
	}
	for cfg, port := range map[string]string{"agg-1/aggregator.yaml": "health_listen: 0.0.0.0:7480", "agg-3/aggregator.yaml": "listen: 0.0.0.0:7400", "silo-1/silo.yaml": "metrics_listen: 0.0.0.0:7490"} {
		p := filepath.Join(dir, "fed", cfg)
		b, _ := os.ReadFile(p)
		if !bytes.Contains(b, []byte("\n"+port+"\n")) {
			t.Errorf("%s lacks %q, where the pod's ports and probes point", cfg, port)
		}
		os.WriteFile(p, []byte(moved.Replace(string(b))), 0o644)
		if out, err := exec.Command(bin, "config", "check", p).CombinedOutput(); err != nil {
			t.Errorf("scellis config check %s: %v\n%s", cfg, err, out)
		}
	}
}
