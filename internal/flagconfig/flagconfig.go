// Package flagconfig fills a command's flags from a YAML config file and from
// environment variables, with flags given on the command line winning, then
// the environment, then the file. Keys in the file are the flag names
// (data-dir: /var/lib/meridian); variables are PREFIX_ + the flag name upper-
// cased with dashes as underscores (MERIDIAN_DATA_DIR).
package flagconfig

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"
)

// Source says where a flag's value came from.
type Source struct {
	EnvPrefix string
	// ConfigFile is the path of the YAML file; empty means none.
	ConfigFile string
	// LookupEnv defaults to os.LookupEnv; tests inject their own.
	LookupEnv func(string) (string, bool)
	// Skip names flags that are never read from file or environment
	// (e.g. "config" itself).
	Skip []string
}

// EnvName is the variable that sets flag name.
func EnvName(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// Apply sets every flag of fs not changed on the command line from the
// environment or the config file. An unknown key in the file, or a value a
// flag rejects, is an error naming the key and its source.
func Apply(fs *pflag.FlagSet, src Source) error {
	lookup := src.LookupEnv
	if lookup == nil {
		lookup = os.LookupEnv
	}
	fileValues, err := readFile(src.ConfigFile)
	if err != nil {
		return err
	}
	skip := map[string]bool{}
	for _, s := range src.Skip {
		skip[s] = true
	}
	if err := checkKeys(fs, fileValues, skip, src.ConfigFile); err != nil {
		return err
	}
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || skip[f.Name] {
			return
		}
		if v, ok := lookup(EnvName(src.EnvPrefix, f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("environment variable %s: %w", EnvName(src.EnvPrefix, f.Name), err))
			}
			return
		}
		if v, ok := fileValues[f.Name]; ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("config file %s: key %q: %w", src.ConfigFile, f.Name, err))
			}
		}
	})
	return errors.Join(errs...)
}

func readFile(path string) (map[string]string, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config file: %w", err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		switch v := v.(type) {
		case string:
			out[k] = v
		case bool, float64, int64, int:
			out[k] = fmt.Sprint(v)
		case nil:
			out[k] = ""
		default:
			return nil, fmt.Errorf("config file %s: key %q: want a scalar value, got %T", path, k, v)
		}
	}
	return out, nil
}

func checkKeys(fs *pflag.FlagSet, values map[string]string, skip map[string]bool, path string) error {
	var unknown []string
	for k := range values {
		if fs.Lookup(k) == nil || skip[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	return fmt.Errorf("config file %s: unknown key %q (keys are flag names, e.g. data-dir)", path, unknown[0])
}
