package main

import (
	"fmt"
	"os"

	"github.com/scellis/scellis/config"
	"github.com/scellis/scellis/diag"
)

func main() {
	c, err := config.LoadSilo(os.Args[1])
	if err != nil {
		if ds, ok := diag.As(err); ok {
			diag.Render(os.Stdout, ds)
			return
		}
		fmt.Println(err)
		return
	}
	fmt.Printf("%+v\n", *c)
}
