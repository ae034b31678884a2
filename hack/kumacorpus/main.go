// Command kumacorpus extracts the policy examples of Kuma's documentation
// (a checkout of github.com/kumahq/kuma-website) as Kuma 2.14 renders them,
// in both the Universal and the Kubernetes shape, into the compatibility
// corpus that internal/api's TestKumaCorpus applies.
//
//	go run ./hack/kumacorpus -website /path/to/kuma-website -out internal/api/testdata/kuma-corpus
//
// It reads every app/_src/policies/*.md page, keeps the text that
// `{% if_version %}` shows for 2.14, and renders each `{% policy_yaml %}`
// block the way the site's plugin does (jekyll-kuma-plugins' policyyaml.rb:
// the Kubernetes root transformer, name_uni/name_kube, and with
// use_meshservice both the legacy and the MeshService form of MeshService
// references). Each output file names its source page and block.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// version is the Kuma release whose rendering is extracted.
var version = [2]int{2, 14}

func main() {
	website := flag.String("website", "", "checkout of github.com/kumahq/kuma-website")
	out := flag.String("out", "internal/api/testdata/kuma-corpus", "output directory (replaced)")
	flag.Parse()
	if *website == "" {
		fmt.Fprintln(os.Stderr, "kumacorpus: -website is required")
		os.Exit(2)
	}
	if err := run(*website, *out); err != nil {
		fmt.Fprintln(os.Stderr, "kumacorpus:", err)
		os.Exit(1)
	}
}

func run(website, out string) error {
	pages, err := filepath.Glob(filepath.Join(website, "app/_src/policies/*.md"))
	if err != nil || len(pages) == 0 {
		return fmt.Errorf("no policy pages under %s/app/_src/policies", website)
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	total := 0
	for _, page := range pages {
		n, err := extractPage(page, out)
		if err != nil {
			return fmt.Errorf("%s: %w", filepath.Base(page), err)
		}
		total += n
	}
	fmt.Printf("%d files from %d pages\n", total, len(pages))
	return nil
}

var (
	ifVersion = regexp.MustCompile(`{%-?\s*if_version\s+([^%]*?)\s*-?%}`)
	endIf     = regexp.MustCompile(`{%-?\s*endif_version\s*-?%}`)
	policyTag = regexp.MustCompile(`{%-?\s*policy_yaml\s*([^%]*?)\s*-?%}`)
	endPolicy = regexp.MustCompile(`{%-?\s*endpolicy_yaml\s*-?%}`)
	rawTag    = regexp.MustCompile(`{%-?\s*(end)?raw\s*-?%}`)
)

// extractPage writes the page's blocks; it returns how many files.
func extractPage(path, out string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	page := strings.TrimSuffix(filepath.Base(path), ".md")
	var stack []bool // visibility of each open if_version
	visible := func() bool {
		for _, v := range stack {
			if !v {
				return false
			}
		}
		return true
	}
	var block *bytes.Buffer
	var params map[string]string
	index, files := 0, 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		// A line may open and close an inline if_version: track in order.
		for _, m := range ifVersion.FindAllStringSubmatch(line, -1) {
			stack = append(stack, shown(m[1]))
		}
		if block == nil && visible() {
			if m := policyTag.FindStringSubmatch(line); m != nil {
				block, params = &bytes.Buffer{}, parseParams(m[1])
				continue
			}
		}
		if block != nil {
			if endPolicy.MatchString(line) {
				index++
				n, err := writeBlock(out, page, index, block.String(), params)
				if err != nil {
					return files, fmt.Errorf("block %d: %w", index, err)
				}
				files += n
				block = nil
			} else if !strings.HasPrefix(strings.TrimSpace(line), "```") {
				block.WriteString(rawTag.ReplaceAllString(line, "") + "\n")
			}
		}
		for range endIf.FindAllString(line, -1) {
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		}
	}
	return files, sc.Err()
}

// shown evaluates an if_version condition list (all must hold) for 2.14.
func shown(cond string) bool {
	for _, c := range strings.Fields(cond) {
		op, v, ok := strings.Cut(c, ":")
		if !ok || op == "inline" {
			continue
		}
		want, err := parseVersion(v)
		if err != nil {
			return false
		}
		cmp := compare(version, want)
		switch op {
		case "eq":
			if cmp != 0 {
				return false
			}
		case "gte":
			if cmp < 0 {
				return false
			}
		case "lte":
			if cmp > 0 {
				return false
			}
		case "gt":
			if cmp <= 0 {
				return false
			}
		case "lt":
			if cmp >= 0 {
				return false
			}
		}
	}
	return true
}

func parseVersion(v string) ([2]int, error) {
	parts := strings.Split(strings.TrimSuffix(v, ".x"), ".")
	if len(parts) < 2 {
		return [2]int{}, fmt.Errorf("version %q", v)
	}
	a, err1 := strconv.Atoi(parts[0])
	b, err2 := strconv.Atoi(parts[1])
	if err := errors.Join(err1, err2); err != nil {
		return [2]int{}, err
	}
	return [2]int{a, b}, nil
}

func compare(a, b [2]int) int {
	if a[0] != b[0] {
		return a[0] - b[0]
	}
	return a[1] - b[1]
}

func parseParams(s string) map[string]string {
	p := map[string]string{}
	for _, item := range strings.Fields(s) {
		k, v, _ := strings.Cut(item, "=")
		p[k] = v
	}
	return p
}

// style is one rendering of a block.
type style struct {
	suffix string
	kube   bool
	legacy bool
}

// writeBlock renders one block in each style the docs show for 2.14.
func writeBlock(out, page string, index int, content string, params map[string]string) (int, error) {
	docs, err := splitDocs(content)
	if err != nil {
		return 0, err
	}
	styles := []style{{"uni", false, true}, {"kube", true, true}}
	if params["use_meshservice"] == "true" {
		styles = append(styles, style{"uni-meshservice", false, false}, style{"kube-meshservice", true, false})
	}
	ns := params["namespace"]
	if ns == "" {
		ns = "kuma-system" // site_data mesh_namespace
	}
	n := 0
	for _, st := range styles {
		var buf bytes.Buffer
		fmt.Fprintf(&buf, "# source: kuma-website app/_src/policies/%s.md, policy_yaml block %d (Kuma 2.14 rendering, %s)\n", page, index, st.suffix)
		for i, d := range docs {
			if i > 0 {
				buf.WriteString("---\n")
			}
			y, err := yaml.Marshal(render(d, st, ns))
			if err != nil {
				return n, err
			}
			buf.Write(y)
		}
		name := fmt.Sprintf("%s-%02d.%s.yaml", page, index, st.suffix)
		if err := os.WriteFile(filepath.Join(out, name), buf.Bytes(), 0o644); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func splitDocs(content string) ([]map[string]any, error) {
	var docs []map[string]any
	for _, part := range regexp.MustCompile(`(?m)^---\s*$`).Split(content, -1) {
		if strings.TrimSpace(part) == "" {
			continue
		}
		var d map[string]any
		if err := yaml.Unmarshal([]byte(part), &d); err != nil {
			return nil, err
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	if len(docs) == 0 {
		return nil, io.ErrUnexpectedEOF
	}
	return docs, nil
}

// render applies the plugin's transformers to one Universal document.
func render(doc map[string]any, st style, ns string) any {
	node := walk(doc, nil, st)
	if !st.kube {
		return node
	}
	d := node.(map[string]any)
	meta := map[string]any{"name": d["name"], "namespace": ns}
	labels := map[string]any{}
	if l, ok := d["labels"].(map[string]any); ok {
		for k, v := range l {
			labels[k] = v
		}
	}
	if m, ok := d["mesh"]; ok {
		labels["kuma.io/mesh"] = m
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	return map[string]any{"apiVersion": "kuma.io/v1alpha1", "kind": d["type"], "metadata": meta, "spec": d["spec"]}
}

func walk(node any, path []string, st style) any {
	switch n := node.(type) {
	case map[string]any:
		n = transform(n, path, st)
		out := map[string]any{}
		keys := make([]string, 0, len(n))
		for k := range n {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			out[k] = walk(n[k], append(append([]string(nil), path...), k), st)
		}
		return out
	case []any:
		out := make([]any, len(n))
		for i, v := range n {
			out[i] = walk(v, path, st)
		}
		return out
	}
	return node
}

func pathIs(path []string, want ...string) bool {
	if len(path) != len(want) {
		return false
	}
	for i := range want {
		if path[i] != want[i] {
			return false
		}
	}
	return true
}

// transform is the plugin's MeshServiceTargetRef, MeshServiceBackendRef and
// Name transformers (nil values are left out, as Kuma's decoding treats
// them).
func transform(n map[string]any, path []string, st style) map[string]any {
	str := func(k string) string { s, _ := n[k].(string); return s }
	set := func(m map[string]any, k string, v any) {
		switch x := v.(type) {
		case nil:
			return
		case string:
			if x == "" {
				return
			}
		}
		m[k] = v
	}
	join := func(parts ...string) string {
		var keep []string
		for _, p := range parts {
			if p != "" {
				keep = append(keep, p)
			}
		}
		return strings.Join(keep, "_")
	}
	portStr := func(v any) string {
		if v == nil {
			return ""
		}
		return fmt.Sprint(v)
	}
	switch {
	case pathIs(path, "spec", "to", "targetRef") && str("kind") == "MeshService":
		out := map[string]any{"kind": "MeshService"}
		switch {
		case st.kube && st.legacy:
			out["name"] = join(str("name"), str("namespace"), "svc", portStr(n["_port"]))
		case st.kube:
			set(out, "name", n["name"])
			set(out, "namespace", n["namespace"])
			set(out, "sectionName", n["sectionName"])
		case st.legacy:
			set(out, "name", n["name"])
		default:
			set(out, "name", n["name"])
			set(out, "sectionName", n["sectionName"])
		}
		return out
	case (pathIs(path, "spec", "to", "rules", "default", "backendRefs") ||
		pathIs(path, "spec", "to", "rules", "default", "filters", "requestMirror", "backendRef")) && str("kind") == "MeshService":
		out := map[string]any{"kind": "MeshService"}
		version, hasVersion := n["_version"]
		switch {
		case st.legacy:
			if st.kube {
				out["name"] = join(str("name"), str("namespace"), "svc", portStr(n["port"]))
			} else {
				set(out, "name", n["name"])
			}
			if hasVersion {
				out["kind"] = "MeshServiceSubset"
				out["tags"] = map[string]any{"version": version}
			}
		default:
			set(out, "name", n["name"])
			if st.kube {
				set(out, "namespace", n["namespace"])
			}
			set(out, "port", n["port"])
			if hasVersion {
				out["name"] = fmt.Sprintf("%s-%v", str("name"), version)
			}
		}
		set(out, "weight", n["weight"])
		return out
	}
	if _, uni := n["name_uni"]; uni || n["name_kube"] != nil {
		out := map[string]any{}
		for k, v := range n {
			if k != "name_uni" && k != "name_kube" {
				out[k] = v
			}
		}
		if st.kube {
			out["name"] = n["name_kube"]
		} else {
			out["name"] = n["name_uni"]
		}
		return out
	}
	return n
}
