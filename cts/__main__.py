from cts.cli import main

main()
