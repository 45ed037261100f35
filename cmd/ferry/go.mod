module github.com/ferrymq/ferry/cmd/ferry

go 1.26.0

replace github.com/ferrymq/ferry => ../..

require (
	github.com/ferrymq/ferry v0.0.0-00010101000000-000000000000
	github.com/rogpeppe/go-internal v1.16.0
	github.com/spf13/cobra v1.10.2
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.26.0 // indirect
	golang.org/x/tools v0.26.0 // indirect
)
