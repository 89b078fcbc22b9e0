// Package yamlx decodes YAML strictly: unknown keys, a second document and
// an empty input are errors, so a typo in a config file stops the start
// instead of being ignored.
package yamlx

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"go.yaml.in/yaml/v3"
)

// DecodeStrict decodes exactly one YAML document from data into out,
// rejecting keys that out does not declare.
func DecodeStrict(data []byte, out any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the file is empty")
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return err
		}
		return fmt.Errorf("line %d: a second YAML document is not allowed", extra.Line)
	}
	return nil
}
