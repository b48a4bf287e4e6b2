from autoaccel.cli import main

main()
