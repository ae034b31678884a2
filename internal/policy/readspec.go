package policy

import (
	"encoding/json"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/meridian-mesh/meridian/internal/resource"
)

// Reading a policy's spec. Every policy a snapshot parses is read here: a
// zone's status recomputes parse each changed policy, its first snapshot
// and a cold zone parse every one. encoding/json's Unmarshal scans the
// input twice and matches each member against the struct's fields case
// insensitively; in a zone's profile of the bench's PUT phase (10,000
// policies) Unmarshal was 14% of the zone's CPU.
//
// readSpec reads with the v2 decoder (github.com/go-json-experiment/json,
// which the project's JSON already uses) in its strict form: members
// matched by exact name, any member rawSpec does not model refused, no
// duplicate names, valid UTF-8 only. On every spec that passes, that reads
// exactly what Unmarshal reads; anything else (a field spelled in another
// case, which Unmarshal would match; a member rawSpec ignores; a value of
// the wrong type, which Unmarshal refuses in the words policies have always
// been reported with) is read again by readSpecStd, as before.
// FuzzReadSpecMatchesUnmarshal holds the two to the same result.

// strictSpec are the v2 decoder's options for the fast read.
var strictSpec = jsonv2.RejectUnknownMembers(true)

// readSpec reads a policy's spec; an empty spec reads as the zero rawSpec.
func readSpec(raw json.RawMessage) (*rawSpec, error) {
	spec := &rawSpec{}
	if len(raw) == 0 {
		return spec, nil
	}
	if jsonv2.Unmarshal(raw, spec, strictSpec) == nil {
		return spec, nil
	}
	return readSpecStd(raw)
}

// readSpecStd reads the spec with encoding/json.
func readSpecStd(raw json.RawMessage) (*rawSpec, error) {
	spec := &rawSpec{}
	if err := json.Unmarshal(raw, spec); err != nil {
		return nil, err
	}
	return spec, nil
}

// UnmarshalJSONFrom is UnmarshalJSON for the v2 decoder.
func (j *jsonValue) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	raw, err := dec.ReadValue()
	if err != nil {
		return err
	}
	j.v, err = resource.ParseJSON(raw)
	return err
}
