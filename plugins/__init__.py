"""Built-in plugins. They register through entry points exactly as third-party ones do."""
