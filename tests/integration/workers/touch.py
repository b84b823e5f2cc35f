"""A worker that only proves it ran: touches the file named by its argument."""
import sys

open(sys.argv[1], "a").close()
