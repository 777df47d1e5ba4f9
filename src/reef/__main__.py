from reef.cli import main

main()
