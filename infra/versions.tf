terraform {
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # Tested with 5.100.0 (the offline test uses exactly that version from a filesystem mirror).
      version = "~> 5.100"
    }
  }
}

# Credentials come from the usual AWS chain (environment, shared profile, SSO, instance role).
# The offline test adds an override file that points this provider at a local moto server.
provider "aws" {
  region = var.region
}
