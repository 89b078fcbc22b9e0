// Package yamlx reads the project's YAML files strictly: unknown keys, a
// second document and an empty input are errors, so a typo in a config file
// stops the start instead of being ignored; and a file larger than MaxFileSize
// is refused before it is read into memory.
package yamlx

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize is the largest file ReadFile accepts: far more than any
// config, priorities, catalog or plan file needs.
const MaxFileSize = 4 << 20

// ReadFile reads the file at path, refusing one larger than MaxFileSize
// (or a stream that never ends, such as /dev/zero) with an error that says
// the limit.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s is larger than the limit of %d MiB for a config file", path, MaxFileSize>>20)
	}
	return data, nil
}

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
