"""What every room of the kit uses: whole-file writes, versioned JSON results files, one CLI error style."""
