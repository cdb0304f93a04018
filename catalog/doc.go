// Package catalog is the content-addressed store of Starlark entities:
// programs, partitioners, reducers, strategies, topologies and the libraries
// they load.
//
// An entry's kind is deduced by parsing its top-level defs (run → program,
// partition → partitioner, reduce → reducer, client_step + server_step →
// strategy, topology → topology, none of these → library), never from its name and never by
// executing it. Built-in entries are embedded from builtin/*.star and go
// through exactly the same function, Parse, as a file a user writes.
//
// Invariants: an entry's Ref is the SHA-256 of its source bytes; a catalog
// never holds two different sources under one name; and nothing in the engine
// branches on the name of a built-in entry.
package catalog
