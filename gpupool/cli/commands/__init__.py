"""One module per `gpupool` verb; importing a module registers its verb with
`gpupool.cli.registry.command` (the map of verbs to modules is `registry.VERBS`)."""
