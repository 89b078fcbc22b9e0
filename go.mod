module github.com/lci-labs/compartment

go 1.26.8

require (
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
)

require go.yaml.in/yaml/v3 v3.0.6 // indirect
