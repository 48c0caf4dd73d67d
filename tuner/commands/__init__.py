"""One module per `moetune` subcommand (discovered by tuner.cli)."""
